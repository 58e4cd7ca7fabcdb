//! Markdown to the plain text WeChat shows: WeChat renders no Markdown, so markup that would
//! show as noise is turned into readable text.
//!
//! Headings lose their `#`, bold and italics their stars, inline code its backticks, links
//! become `text (url)`, list bullets `• `, table rows `cell | cell` without their rule lines,
//! and common LaTeX becomes Unicode (`\frac{a}{b}` → `(a)/(b)`, `\times` → `×`). Code fences
//! lose their ``` lines; the code between them is kept exactly. Not here: chunking
//! ([`crate::chunk`]), which runs before, on the Markdown.

/// Plain text for `markdown`.
pub fn plain_text(markdown: &str) -> String {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            out.push(line.to_owned());
            continue;
        }
        if let Some(converted) = block_line(line) {
            out.push(converted);
        }
    }
    let mut text = out.join("\n");
    while text.contains("\n\n\n") {
        text = text.replace("\n\n\n", "\n\n");
    }
    text.trim_matches('\n').to_owned()
}

/// One line outside code: `None` drops it (a table rule, a `$$` fence line).
fn block_line(line: &str) -> Option<String> {
    let trimmed = line.trim();
    if trimmed == "$$" || trimmed == "\\[" || trimmed == "\\]" {
        return None;
    }
    if trimmed.starts_with('|') && trimmed.ends_with('|') {
        let cells: Vec<&str> = trimmed.trim_matches('|').split('|').map(str::trim).collect();
        if cells.iter().all(|cell| !cell.is_empty() && cell.chars().all(|c| matches!(c, '-' | ':' | ' '))) {
            return None;
        }
        return Some(cells.iter().map(|cell| inline(cell)).collect::<Vec<_>>().join(" | "));
    }
    let hashes = trimmed.chars().take_while(|c| *c == '#').count();
    if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
        return Some(inline(trimmed[hashes..].trim()));
    }
    if trimmed == "---" || trimmed == "***" || trimmed == "___" {
        return Some("—————".to_owned());
    }
    let indent = &line[..line.len() - line.trim_start().len()];
    for bullet in ["- ", "* ", "+ "] {
        if let Some(rest) = trimmed.strip_prefix(bullet) {
            return Some(format!("{indent}• {}", inline(rest)));
        }
    }
    Some(inline(line))
}

/// Inline markup of one line; inside `code spans` nothing changes but the backticks go.
fn inline(text: &str) -> String {
    let segments: Vec<&str> = text.split('`').collect();
    // An odd number of backticks leaves the last one unpaired: keep it as written.
    let paired = segments.len() % 2 == 1;
    let mut out = String::with_capacity(text.len());
    for (index, segment) in segments.iter().enumerate() {
        let in_code = index % 2 == 1;
        if in_code && !paired && index == segments.len() - 1 {
            out.push('`');
            out.push_str(&markup(segment));
        } else if in_code {
            out.push_str(segment);
        } else {
            out.push_str(&markup(segment));
        }
    }
    out
}

/// Emphasis, links and math of text outside code spans.
fn markup(text: &str) -> String {
    let text = links(text);
    let text = math(&text);
    let text = text.replace("**", "").replace("__", "").replace("~~", "");
    single_stars(&text)
}

/// `[text](url)` → `text (url)`, `![alt](url)` → `alt (url)`.
fn links(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|i| open + i) else { break };
        let Some(end) = rest[close + 2..].find(')').map(|i| close + 2 + i) else { break };
        let label = &rest[open + 1..close];
        let target = &rest[close + 2..end];
        let before = rest[..open].strip_suffix('!').unwrap_or(&rest[..open]);
        out.push_str(before);
        if label.is_empty() || label == target {
            out.push_str(target);
        } else {
            out.push_str(&format!("{label} ({target})"));
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// `*word*` → `word` when the stars wrap text (not `2 * 3` or a bullet).
fn single_stars(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut keep = vec![true; chars.len()];
    let mut open: Option<usize> = None;
    for (i, c) in chars.iter().enumerate() {
        if *c != '*' {
            continue;
        }
        let next = chars.get(i + 1).copied();
        let prev = i.checked_sub(1).map(|p| chars[p]);
        match open {
            None if next.is_some_and(|n| !n.is_whitespace()) => open = Some(i),
            Some(start) if prev.is_some_and(|p| !p.is_whitespace()) => {
                keep[start] = false;
                keep[i] = false;
                open = None;
            }
            None | Some(_) => {}
        }
    }
    chars.iter().zip(keep).filter(|(_, kept)| *kept).map(|(c, _)| *c).collect()
}

/// LaTeX delimiters removed and common commands as Unicode.
fn math(text: &str) -> String {
    if !text.contains('$') && !text.contains('\\') {
        return text.to_owned();
    }
    let mut text = text.replace("$$", "").replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "");
    text = inline_dollars(&text);
    text = commands_with_arguments(&text);
    const SYMBOLS: [(&str, &str); 28] = [
        ("\\times", "×"),
        ("\\cdot", "·"),
        ("\\div", "÷"),
        ("\\pm", "±"),
        ("\\leq", "≤"),
        ("\\geq", "≥"),
        ("\\le", "≤"),
        ("\\ge", "≥"),
        ("\\neq", "≠"),
        ("\\approx", "≈"),
        ("\\infty", "∞"),
        ("\\sum", "∑"),
        ("\\prod", "∏"),
        ("\\int", "∫"),
        ("\\rightarrow", "→"),
        ("\\to", "→"),
        ("\\Rightarrow", "⇒"),
        ("\\alpha", "α"),
        ("\\beta", "β"),
        ("\\gamma", "γ"),
        ("\\delta", "δ"),
        ("\\theta", "θ"),
        ("\\lambda", "λ"),
        ("\\mu", "μ"),
        ("\\pi", "π"),
        ("\\sigma", "σ"),
        ("\\left", ""),
        ("\\right", ""),
    ];
    for (command, symbol) in SYMBOLS {
        text = text.replace(command, symbol);
    }
    text = scripts(&text);
    text.replace(['{', '}'], "")
}

/// `^{2}` → `^2`, `^{n+1}` → `^(n+1)` (and the same for `_`).
fn scripts(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(['^', '_']) {
        out.push_str(&rest[..=at]);
        let after = &rest[at + 1..];
        match braced(after) {
            Some((inner, used)) if inner.chars().count() == 1 => {
                out.push_str(inner);
                rest = &after[used..];
            }
            Some((inner, used)) => {
                out.push_str(&format!("({inner})"));
                rest = &after[used..];
            }
            None => rest = after,
        }
    }
    out.push_str(rest);
    out
}

/// `$x$` → `x` when it looks like math (no space inside the dollars, not `$5 and $10`).
fn inline_dollars(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('$') {
        let after = &rest[open + 1..];
        let close = after.find('$');
        let looks_like_math = close.is_some_and(|close| {
            let inner = &after[..close];
            !inner.is_empty()
                && !inner.starts_with(' ')
                && !inner.ends_with(' ')
                && !after[close + 1..].starts_with(|c: char| c.is_ascii_digit())
        });
        match (close, looks_like_math) {
            (Some(close), true) => {
                out.push_str(&rest[..open]);
                out.push_str(&after[..close]);
                rest = &after[close + 1..];
            }
            (Some(_) | None, _) => {
                out.push_str(&rest[..=open]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `\frac{a}{b}` → `(a)/(b)`, `\sqrt{x}` → `√(x)`, `\text{t}`/`\mathrm{t}` → `t`.
fn commands_with_arguments(text: &str) -> String {
    let mut text = text.to_owned();
    for (command, arity) in [("\\frac", 2), ("\\sqrt", 1), ("\\text", 1), ("\\mathrm", 1), ("\\mathbf", 1)] {
        while let Some(start) = text.find(command) {
            let mut cursor = start + command.len();
            let mut arguments = Vec::new();
            for _ in 0..arity {
                match braced(&text[cursor..]) {
                    Some((argument, used)) => {
                        arguments.push(argument.to_owned());
                        cursor += used;
                    }
                    None => break,
                }
            }
            if arguments.len() != arity {
                // Not the shape we know: drop the backslash so the loop ends.
                text.replace_range(start..start + 1, "");
                continue;
            }
            let replacement = match command {
                "\\frac" => format!("({})/({})", arguments[0], arguments[1]),
                "\\sqrt" => format!("√({})", arguments[0]),
                _ => arguments[0].clone(),
            };
            text.replace_range(start..cursor, &replacement);
        }
    }
    text
}

/// The `{…}` at the start of `text` (nesting allowed): its inside and the bytes it spans.
fn braced(text: &str) -> Option<(&str, usize)> {
    if !text.starts_with('{') {
        return None;
    }
    let mut depth = 0usize;
    for (index, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((&text[1..index], index + 1));
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::plain_text;

    fn check(markdown: &str, expected: &str) {
        assert_eq!(plain_text(markdown), expected, "from {markdown:?}");
    }

    #[test]
    fn headings_emphasis_links_and_lists() {
        check("# Report\n\n**Bold** and *italic* and `code`.", "Report\n\nBold and italic and code.");
        check(
            "See [the docs](https://example.com/docs) or ![chart](https://e.com/c.png).",
            "See the docs (https://example.com/docs) or chart (https://e.com/c.png).",
        );
        check("- one\n* two\n  - nested", "• one\n• two\n  • nested");
        check("2 * 3 = 6 and snake_case_name stays", "2 * 3 = 6 and snake_case_name stays");
        check("Call `__init__` with `**kwargs`, not __bold__.", "Call __init__ with **kwargs, not bold.");
    }

    #[test]
    fn tables_lose_their_rules() {
        check("| Name | Score |\n|---|:---:|\n| **Ann** | 9 |", "Name | Score\nAnn | 9");
    }

    #[test]
    fn latex_becomes_unicode() {
        check("Area: $\\frac{a}{b} \\times r^{2}$", "Area: (a)/(b) × r^2");
        check("$e^{i\\pi} + x_{n+1}$", "e^(iπ) + x_(n+1)");
        check("$$\n\\sqrt{x} \\leq \\infty\n$$", "√(x) ≤ ∞");
        check("It costs $5 and $10.", "It costs $5 and $10.");
    }

    #[test]
    fn code_is_kept_exactly_without_fences() {
        check("Run:\n```rust\nlet **x** = a * b;\n```\nDone.", "Run:\nlet **x** = a * b;\nDone.");
    }
}
