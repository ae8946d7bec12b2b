//! Bounded reads: an answer is held in memory only up to a cap, and a newline-delimited
//! stream is split into lines each within a cap (the stream as a whole is not one answer).

use super::UpstreamError;

const KI: u64 = 1 << 10;

/// A byte count as the flag is written: `16Mi` when exact, else bytes.
pub fn show_bytes(n: u64) -> String {
    for (unit, size) in [("Gi", KI * KI * KI), ("Mi", KI * KI), ("Ki", KI)] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{}{unit}", n / size);
        }
    }
    format!("{n} bytes")
}

/// Read a response body into memory, never past `cap` bytes: a declared `Content-Length` above
/// the cap fails before reading, and a body that grows past it fails as soon as it does.
pub async fn read_capped(mut resp: reqwest::Response, cap: u64) -> Result<Vec<u8>, UpstreamError> {
    if resp.content_length().is_some_and(|n| n > cap) {
        return Err(UpstreamError::TooLarge { cap });
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(UpstreamError::Transport)? {
        if (out.len() + chunk.len()) as u64 > cap {
            return Err(UpstreamError::TooLarge { cap });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Splits a newline-delimited stream into lines, none longer than `cap` bytes (a line is one
/// answer of SpiceDB's read streams: the stream as a whole is not capped).
#[derive(Debug)]
pub struct Lines {
    buf: Vec<u8>,
    cap: u64,
}

impl Lines {
    pub fn new(cap: u64) -> Self {
        Self {
            buf: Vec::new(),
            cap,
        }
    }

    /// Add a chunk; returns the lines it completed (without their newline).
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>, UpstreamError> {
        let mut out = Vec::new();
        let mut rest = chunk;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            self.extend(&rest[..pos])?;
            out.push(std::mem::take(&mut self.buf));
            rest = &rest[pos + 1..];
        }
        self.extend(rest)?;
        Ok(out)
    }

    fn extend(&mut self, part: &[u8]) -> Result<(), UpstreamError> {
        if (self.buf.len() + part.len()) as u64 > self.cap {
            return Err(UpstreamError::TooLarge { cap: self.cap });
        }
        self.buf.extend_from_slice(part);
        Ok(())
    }

    /// What is left after the stream ended (a last line without a newline).
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_as_flags_write_them() {
        assert_eq!(show_bytes(16 << 20), "16Mi");
        assert_eq!(show_bytes(1536), "1536 bytes");
        assert_eq!(show_bytes(3 << 10), "3Ki");
    }

    #[test]
    fn lines_are_bounded_not_the_stream() {
        let mut l = Lines::new(8);
        assert_eq!(l.push(b"abc\nde").unwrap(), vec![b"abc".to_vec()]);
        assert_eq!(
            l.push(b"f\n\ngh").unwrap(),
            vec![b"def".to_vec(), Vec::new()]
        );
        // Many lines in all, each short: fine.
        for _ in 0..1000 {
            assert_eq!(l.push(b"\n1234567\n").unwrap().len(), 2);
        }
        assert_eq!(l.finish(), b"".to_vec());
        // One line past the cap fails while it grows, however it is chunked.
        let mut l = Lines::new(8);
        assert!(l.push(b"12345").unwrap().is_empty());
        assert!(matches!(
            l.push(b"6789"),
            Err(UpstreamError::TooLarge { cap: 8 })
        ));
        let mut l = Lines::new(8);
        assert!(l.push(b"123456789\n").is_err());
    }
}
