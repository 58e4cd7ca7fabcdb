//! Reading a process's stdout or stderr into bounded memory.
//!
//! A stream is kept whole up to a byte budget; past it, its start and its end are kept and the
//! middle is only counted. A command printing forever therefore costs a fixed amount of memory,
//! and what matters most (the end, where errors and summaries are) is always there.
//! This module does not format anything for the model.

use std::collections::VecDeque;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

/// Bytes of a stream: the first `head_capacity`, then a window over the last `tail_capacity`.
#[derive(Debug)]
pub(crate) struct CappedBuffer {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_capacity: usize,
    tail_capacity: usize,
    total: u64,
}

impl CappedBuffer {
    pub(crate) fn new(head_capacity: usize, tail_capacity: usize) -> Self {
        Self { head: Vec::new(), tail: VecDeque::new(), head_capacity, tail_capacity, total: 0 }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        self.total = self.total.saturating_add(data.len() as u64);
        let to_head = self.head_capacity.saturating_sub(self.head.len()).min(data.len());
        self.head.extend_from_slice(&data[..to_head]);
        let rest = &data[to_head..];
        let rest = &rest[rest.len().saturating_sub(self.tail_capacity)..];
        self.tail.extend(rest);
        let excess = self.tail.len().saturating_sub(self.tail_capacity);
        self.tail.drain(..excess);
    }

    /// Decode what was kept (invalid UTF-8 becomes U+FFFD).
    pub(crate) fn into_text(self) -> StreamText {
        let kept = self.head.len() as u64 + self.tail.len() as u64;
        let omitted_bytes = self.total.saturating_sub(kept);
        let mut tail = Vec::from(self.tail);
        if omitted_bytes == 0 {
            let mut whole = self.head;
            whole.append(&mut tail);
            let text = String::from_utf8_lossy(&whole).into_owned();
            return StreamText { head_len: text.len(), text, omitted_bytes, total_bytes: self.total };
        }
        // Both cut points may fall inside a character: drop the partial bytes rather than show
        // replacement characters that the stream never contained.
        let head = String::from_utf8_lossy(trim_partial_end(&self.head)).into_owned();
        let tail = String::from_utf8_lossy(trim_partial_start(&tail)).into_owned();
        StreamText { head_len: head.len(), text: head + &tail, omitted_bytes, total_bytes: self.total }
    }
}

/// A captured stream as text: `text[..head_len]`, then `omitted_bytes` left out, then the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamText {
    pub text: String,
    /// Byte index in `text` where bytes were left out (only meaningful when `omitted_bytes > 0`).
    pub head_len: usize,
    pub omitted_bytes: u64,
    pub total_bytes: u64,
}

impl StreamText {
    pub(crate) fn was_cut(&self) -> bool {
        self.omitted_bytes > 0
    }

    /// The text with a line marking where bytes were left out, for the saved file.
    pub(crate) fn with_omission_marker(&self) -> String {
        if !self.was_cut() {
            return self.text.clone();
        }
        let (head, tail) = self.text.split_at(self.head_len);
        let newline = if head.ends_with('\n') || head.is_empty() { "" } else { "\n" };
        format!(
            "{head}{newline}[… {} bytes left out here: the stream was longer than tools.shell.max_saved_output_bytes …]\n{tail}",
            self.omitted_bytes
        )
    }

    /// Remove one final newline (the shell's last line feed), so that `=== STDERR ===` follows
    /// the output on its own line as in spec example 6.1.
    pub(crate) fn strip_final_newline(&mut self) {
        if self.text.ends_with('\n') {
            self.text.pop();
            self.head_len = self.head_len.min(self.text.len());
        }
    }
}

/// Read `reader` to its end (or until `stop` fires) into a [`CappedBuffer`]. The reader is
/// handed back: stopped before its end, it still holds what was not read (a command moved to
/// the background goes on writing into it).
pub(crate) async fn capture<R: AsyncRead + Unpin>(
    mut reader: R,
    mut buffer: CappedBuffer,
    stop: CancellationToken,
) -> (R, CappedBuffer) {
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            // `stop` first: a process writing without pause must not keep the reader forever.
            biased;
            () = stop.cancelled() => break,
            read = reader.read(&mut chunk) => match read {
                Ok(0) | Err(_) => break,
                Ok(count) => buffer.push(&chunk[..count]),
            },
        }
    }
    (reader, buffer)
}

fn trim_partial_end(bytes: &[u8]) -> &[u8] {
    // Look back at most 3 bytes for the start of a character that does not fit.
    for back in 1..=bytes.len().min(4) {
        let index = bytes.len() - back;
        let byte = bytes[index];
        if byte & 0b1100_0000 != 0b1000_0000 {
            let needed = if byte < 0x80 {
                1
            } else if byte >= 0xF0 {
                4
            } else if byte >= 0xE0 {
                3
            } else {
                2
            };
            return if back < needed { &bytes[..index] } else { bytes };
        }
    }
    bytes
}

fn trim_partial_start(bytes: &[u8]) -> &[u8] {
    let continuation = bytes.iter().take(3).take_while(|byte| **byte & 0b1100_0000 == 0b1000_0000).count();
    &bytes[continuation..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_streams_are_kept_whole() {
        let mut buffer = CappedBuffer::new(8, 8);
        buffer.push(b"hello ");
        buffer.push(b"world");
        let text = buffer.into_text();
        assert_eq!(text.text, "hello world");
        assert!(!text.was_cut());
        assert_eq!(text.total_bytes, 11);
    }

    #[test]
    fn long_streams_keep_start_and_end() {
        let mut buffer = CappedBuffer::new(4, 4);
        for _ in 0..10 {
            buffer.push(b"0123456789");
        }
        let text = buffer.into_text();
        assert_eq!(text.text, "01236789");
        assert_eq!(text.head_len, 4);
        assert_eq!(text.omitted_bytes, 92);
        assert_eq!(text.with_omission_marker().lines().count(), 3);
        assert!(text.with_omission_marker().starts_with("0123\n[… 92 bytes left out"));
    }

    #[test]
    fn cut_points_inside_a_character_are_dropped() {
        let mut buffer = CappedBuffer::new(2, 2);
        buffer.push("aé".as_bytes()); // the head's 2 bytes end inside 'é'
        buffer.push(b"xxxxxxxx");
        buffer.push("é!".as_bytes()); // the tail's 2 bytes start inside 'é'
        let text = buffer.into_text();
        assert_eq!(text.text, "a!");
        assert_eq!(text.head_len, 1);
    }

    #[test]
    fn final_newline_is_stripped_once() {
        let mut buffer = CappedBuffer::new(64, 64);
        buffer.push(b"out\n\n");
        let mut text = buffer.into_text();
        text.strip_final_newline();
        assert_eq!(text.text, "out\n");
    }
}
