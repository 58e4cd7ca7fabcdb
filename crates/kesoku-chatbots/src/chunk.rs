//! Splitting a long text into platform-sized chunks.
//!
//! A cut falls, by preference, at a blank line, a line end, a sentence end, a space, and only
//! when none is in reach in the middle of a word. A code fence open at a cut is closed at the
//! end of its chunk and reopened (with its language) at the start of the next, so every chunk
//! renders on its own. Lengths are counted in characters (Unicode scalar values), as platforms
//! state their limits.
//!
//! Not here: which limit applies (the chatbot's [`crate::Capabilities`]) or sending.

/// The fence that closes an open code block at the end of a chunk.
const CLOSE_FENCE: &str = "\n```";

/// Split `text` into chunks of at most `max_chars` characters each (`max_chars` below 16 is
/// treated as 16, the least room a reopened fence needs). A text that fits is one chunk;
/// an empty text is no chunk.
pub fn chunk_text(text: &str, max_chars: usize) -> Vec<String> {
    let max_chars = max_chars.max(16);
    let text = text.trim_end();
    if text.is_empty() {
        return Vec::new();
    }
    if text.chars().count() <= max_chars {
        return vec![text.to_owned()];
    }
    let mut chunks = Vec::new();
    let mut rest = text;
    // The language of the code fence open where the previous chunk was cut.
    let mut open_fence: Option<String> = None;
    while !rest.is_empty() {
        let reopen = open_fence.as_ref().map(|lang| format!("```{lang}\n")).unwrap_or_default();
        let budget = max_chars.saturating_sub(reopen.chars().count()).saturating_sub(CLOSE_FENCE.len()).max(1);
        let (piece, remainder) = if rest.chars().count() + reopen.chars().count() <= max_chars {
            (rest, "")
        } else {
            split_at_best(rest, budget)
        };
        let fence_after = fence_state_after(open_fence.clone(), piece);
        let mut chunk = reopen;
        chunk.push_str(piece.trim_end());
        if fence_after.is_some() && !remainder.is_empty() {
            chunk.push_str(CLOSE_FENCE);
        }
        if !chunk.trim().is_empty() {
            chunks.push(chunk);
        }
        open_fence = fence_after;
        rest = remainder.trim_start_matches('\n');
    }
    chunks
}

/// Cut `text` within its first `budget` characters at the best place; returns both halves.
fn split_at_best(text: &str, budget: usize) -> (&str, &str) {
    let window_end = text.char_indices().nth(budget).map_or(text.len(), |(index, _)| index);
    let window = &text[..window_end];
    // Prefer cuts in the second half of the window, so chunks are not needlessly short.
    let half = window.len() / 2;
    let candidates = [
        window.rfind("\n\n").filter(|&i| i >= half),
        window.rfind('\n').filter(|&i| i >= half),
        sentence_end(window).filter(|&i| i >= half),
        window.rfind(' ').filter(|&i| i >= half),
        window.rfind('\n'),
        sentence_end(window),
        window.rfind(' '),
    ];
    let cut = candidates.into_iter().flatten().find(|&i| i > 0).unwrap_or(window_end);
    let (piece, rest) = text.split_at(cut);
    (piece, rest.strip_prefix(' ').unwrap_or(rest))
}

/// The byte index just after the last sentence end (`.`, `!`, `?` followed by a space, or a
/// CJK full stop) in `window`.
fn sentence_end(window: &str) -> Option<usize> {
    let latin = [". ", "! ", "? "].iter().filter_map(|end| window.rfind(end).map(|i| i + 1)).max();
    let cjk = ['。', '！', '？'].iter().filter_map(|end| window.rfind(*end).map(|i| i + end.len_utf8())).max();
    latin.max(cjk)
}

/// Whether a code fence is open after `piece`, given the state before it; `Some(language)`.
fn fence_state_after(mut open: Option<String>, piece: &str) -> Option<String> {
    for line in piece.lines() {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            open = match open {
                Some(_) => None,
                None => Some(info.trim().to_owned()),
            };
        }
    }
    open
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    fn fences_balanced(chunk: &str) -> bool {
        chunk.lines().filter(|line| line.trim_start().starts_with("```")).count() % 2 == 0
    }

    #[test]
    fn short_text_is_one_chunk_and_empty_text_none() {
        assert_eq!(chunk_text("hello", 2000), vec!["hello"]);
        assert!(chunk_text("  \n", 2000).is_empty());
    }

    #[test]
    fn cuts_prefer_line_ends_then_sentences_then_spaces() {
        let text = format!("{}\n{}", "a".repeat(30), "b".repeat(30));
        assert_eq!(chunk_text(&text, 40), vec!["a".repeat(30), "b".repeat(30)]);
        let sentences = "One two three four. Five six seven eight nine.";
        assert_eq!(chunk_text(sentences, 30), vec!["One two three four.", "Five six seven eight nine."]);
        let words = "alpha beta gamma delta epsilon zeta eta theta";
        let chunks = chunk_text(words, 20);
        assert!(chunks.iter().all(|c| c.chars().count() <= 20 && !c.starts_with(' ')), "{chunks:?}");
        assert_eq!(chunks.join(" "), words);
    }

    #[test]
    fn a_word_longer_than_the_limit_is_cut_inside() {
        let word = "x".repeat(50);
        let chunks = chunk_text(&word, 20);
        assert!(chunks.iter().all(|c| c.chars().count() <= 20));
        assert_eq!(chunks.concat(), word);
    }

    #[test]
    fn five_thousand_characters_with_a_code_block_make_renderable_chunks() {
        let prose = "This sentence explains the code. ".repeat(40);
        let code: String = (0..120).map(|i| format!("    let value_{i} = compute({i});\n")).collect();
        let text = format!("{prose}\n\n```rust\nfn main() {{\n{code}}}\n```\n\n{prose}");
        assert!(text.chars().count() > 5000);
        let chunks = chunk_text(&text, 2000);
        assert!(chunks.len() >= 3, "{}", chunks.len());
        for chunk in &chunks {
            assert!(chunk.chars().count() <= 2000, "{} chars", chunk.chars().count());
            assert!(fences_balanced(chunk), "unbalanced fences in:\n{chunk}");
        }
        // A chunk that continues the code block reopens it with its language.
        assert!(chunks.iter().skip(1).any(|c| c.starts_with("```rust\n")), "{chunks:#?}");
        // Nothing is lost: every code line appears exactly once.
        for i in 0..120 {
            let line = format!("let value_{i} = compute({i});");
            assert_eq!(chunks.iter().map(|c| c.matches(&line).count()).sum::<usize>(), 1, "{line}");
        }
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        let text = "日本語の文章です。".repeat(300);
        let chunks = chunk_text(&text, 100);
        assert!(chunks.iter().all(|c| c.chars().count() <= 100));
        assert_eq!(chunks.concat(), text);
    }
}
