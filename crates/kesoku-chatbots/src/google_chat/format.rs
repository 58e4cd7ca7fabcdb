//! The agent's Markdown-ish text in Google Chat's own text formatting: `*bold*`, `_italic_`,
//! `~strike~`, `` `code` ``, fenced blocks, `<url|label>` links, `* ` bullets.
//!
//! Converted: `**bold**` / `__bold__` → `*bold*`, `*italic*` → `_italic_`, `~~x~~` → `~x~`,
//! `[label](url)` → `<url|label>`, headings → a bold line, `- item` / `+ item` → `* item`.
//! Code (spans and fenced blocks) is kept verbatim. The result is never longer than the input,
//! so a chunk within Chat's limit stays within it.

/// Convert one chunk of Markdown-ish text.
pub fn to_chat_text(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut in_fence = false;
    for (index, line) in markdown.split('\n').enumerate() {
        if index > 0 {
            out.push('\n');
        }
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            out.push_str(line);
            continue;
        }
        if in_fence {
            out.push_str(line);
            continue;
        }
        out.push_str(&convert_line(line));
    }
    out
}

fn convert_line(line: &str) -> String {
    let indent_len = line.len() - line.trim_start().len();
    let (indent, rest) = line.split_at(indent_len);
    let heading = rest.trim_start_matches('#');
    if rest.starts_with('#') && rest.len() - heading.len() <= 6 && heading.starts_with(' ') {
        let title = inline(heading.trim());
        let title = title.trim_matches('*');
        return if title.is_empty() { String::new() } else { format!("{indent}*{title}*") };
    }
    for bullet in ["- ", "+ ", "* "] {
        if let Some(item) = rest.strip_prefix(bullet) {
            return format!("{indent}* {}", inline(item));
        }
    }
    format!("{indent}{}", inline(rest))
}

/// Inline markup of one line outside code.
fn inline(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '`' => {
                // A code span: copied as it is up to its closing backtick.
                let end = chars[i + 1..].iter().position(|&d| d == '`').map(|p| i + 1 + p);
                match end {
                    Some(end) => {
                        out.extend(&chars[i..=end]);
                        i = end + 1;
                    }
                    None => {
                        out.push(c);
                        i += 1;
                    }
                }
            }
            '*' | '_' if next == Some(c) => {
                out.push('*');
                i += 2;
            }
            '~' if next == Some('~') => {
                out.push('~');
                i += 2;
            }
            '*' if next.is_some_and(|n| !n.is_whitespace()) && closes(&chars[i + 1..], '*') => {
                out.push('_');
                let end = i + 1 + chars[i + 1..].iter().position(|&d| d == '*').unwrap_or(0);
                out.extend(&chars[i + 1..end]);
                out.push('_');
                i = end + 1;
            }
            '[' => match link(&chars[i..]) {
                Some((label, url, used)) => {
                    out.push_str(&format!("<{url}|{label}>"));
                    i += used;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            },
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Whether a single `marker` closes the emphasis opened just before `rest` (not a `**`).
fn closes(rest: &[char], marker: char) -> bool {
    rest.iter()
        .position(|&d| d == marker)
        .is_some_and(|p| p > 0 && !rest[p - 1].is_whitespace() && rest.get(p + 1) != Some(&marker))
}

/// `[label](url)` at the start of `chars`: (label, url, characters used).
fn link(chars: &[char]) -> Option<(String, String, usize)> {
    let close = chars.iter().position(|&c| c == ']')?;
    if chars.get(close + 1) != Some(&'(') {
        return None;
    }
    let end = close + 2 + chars[close + 2..].iter().position(|&c| c == ')')?;
    let label: String = chars[1..close].iter().collect();
    let url: String = chars[close + 2..end].iter().collect();
    let url_ok = url.starts_with("http://") || url.starts_with("https://") || url.starts_with("mailto:");
    if label.is_empty() || !url_ok || url.contains(' ') {
        return None;
    }
    Some((label, url, end + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_becomes_chat_formatting() {
        let cases = [
            ("The answer is **40**.", "The answer is *40*."),
            ("Some *emphasis* and __strong__ and ~~gone~~", "Some _emphasis_ and *strong* and ~gone~"),
            ("See [the docs](https://example.com/a_b) now", "See <https://example.com/a_b|the docs> now"),
            ("## Results", "*Results*"),
            ("- one\n  + two", "* one\n  * two"),
            ("`a**b` stays", "`a**b` stays"),
            ("```rust\nlet x = **y**;\n```", "```rust\nlet x = **y**;\n```"),
            ("2 * 3 * 4", "2 * 3 * 4"),
            ("[not a link] (x)", "[not a link] (x)"),
            ("#hashtag", "#hashtag"),
        ];
        for (markdown, chat) in cases {
            assert_eq!(to_chat_text(markdown), chat, "{markdown}");
            assert!(to_chat_text(markdown).chars().count() <= markdown.chars().count());
        }
    }
}
