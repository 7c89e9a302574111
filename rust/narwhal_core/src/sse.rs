//! SSE framing of engine bytes: lines (LF, CRLF or CR, split anywhere) into event payloads.

use crate::error::StreamError;

/// Largest event (or unterminated line) the framer buffers before giving up; keeps memory
/// bounded when an engine never ends its event.
pub const MAX_EVENT_BYTES: usize = 16 << 20;

/// Incremental `text/event-stream` parser. Feed it network reads in any split; it calls
/// back once per complete event that has at least one `data:` line, with the data lines
/// joined by `\n`. Comment lines and `event:`/`id:`/`retry:` (any other field) are ignored.
#[derive(Debug, Default)]
pub struct SseFramer {
    /// An unterminated line carried over from the previous read.
    line: Vec<u8>,
    /// The data buffer of the event being built.
    data: Vec<u8>,
    /// Number of `data` lines in the event being built.
    data_lines: u32,
    /// The previous read ended in CR: a LF at the start of the next read belongs to it.
    skip_lf: bool,
}

/// Position of the first CR or LF in `s`, eight bytes at a time.
#[inline]
fn find_eol(s: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let has_zero = |v: u64| v.wrapping_sub(LO) & !v & HI;
    let mut i = 0;
    while i + 8 <= s.len() {
        let mut word = [0u8; 8];
        word.copy_from_slice(&s[i..i + 8]);
        let v = u64::from_le_bytes(word);
        if has_zero(v ^ (LO * u64::from(b'\n'))) | has_zero(v ^ (LO * u64::from(b'\r'))) != 0 {
            break;
        }
        i += 8;
    }
    s[i..]
        .iter()
        .position(|&b| b == b'\n' || b == b'\r')
        .map(|p| p + i)
}

impl SseFramer {
    /// A framer at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes held for an incomplete event (partial line plus data so far).
    pub fn buffered(&self) -> usize {
        self.line.len() + self.data.len()
    }

    /// Frame one read. `on_event(payload, data_lines)` runs for each complete event and
    /// returns false to stop (the rest of the read is dropped). Returns Ok(false) when
    /// stopped by the callback, Ok(true) when the whole read was consumed.
    pub fn feed<F>(&mut self, input: &[u8], on_event: &mut F) -> Result<bool, StreamError>
    where
        F: FnMut(&[u8], u32) -> bool,
    {
        let mut pos = 0;
        if self.skip_lf && !input.is_empty() {
            if input[0] == b'\n' {
                pos = 1;
            }
            self.skip_lf = false;
        }
        while pos < input.len() {
            let rest = &input[pos..];
            let Some(eol) = find_eol(rest) else {
                self.line.extend_from_slice(rest);
                if self.buffered() > MAX_EVENT_BYTES {
                    return Err(StreamError::malformed(format!(
                        "engine event exceeds {MAX_EVENT_BYTES} bytes"
                    )));
                }
                return Ok(true);
            };
            let mut next = eol + 1;
            if rest[eol] == b'\r' {
                match rest.get(eol + 1) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            let go_on = if self.line.is_empty() {
                self.line_done(&rest[..eol], on_event)
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&rest[..eol]);
                let go_on = self.line_done(&line, on_event);
                line.clear();
                self.line = line;
                go_on
            };
            if !go_on {
                return Ok(false);
            }
            if self.data.len() > MAX_EVENT_BYTES {
                return Err(StreamError::malformed(format!(
                    "engine event exceeds {MAX_EVENT_BYTES} bytes"
                )));
            }
            pos += next;
        }
        Ok(true)
    }

    fn line_done<F>(&mut self, line: &[u8], on_event: &mut F) -> bool
    where
        F: FnMut(&[u8], u32) -> bool,
    {
        if line.is_empty() {
            if self.data_lines == 0 {
                return true;
            }
            let go_on = on_event(&self.data, self.data_lines);
            self.data.clear();
            self.data_lines = 0;
            return go_on;
        }
        let value = if let Some(v) = line.strip_prefix(b"data:") {
            v
        } else if line == b"data" {
            &[][..]
        } else {
            return true; // comment, other field, or a line without a known field
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if self.data_lines > 0 {
            self.data.push(b'\n');
        }
        self.data.extend_from_slice(value);
        self.data_lines += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_all(reads: &[&[u8]]) -> Vec<(Vec<u8>, u32)> {
        let mut f = SseFramer::new();
        let mut events = Vec::new();
        for r in reads {
            f.feed(r, &mut |p: &[u8], n| {
                events.push((p.to_vec(), n));
                true
            })
            .unwrap();
        }
        events
    }

    fn payloads(reads: &[&[u8]]) -> Vec<Vec<u8>> {
        frame_all(reads).into_iter().map(|(p, _)| p).collect()
    }

    #[test]
    fn lf_crlf_and_cr_endings() {
        for sep in [&b"\n"[..], b"\r\n", b"\r"] {
            let mut s = Vec::new();
            for ev in [&b"data: {\"a\":1}"[..], b"data:[DONE]"] {
                s.extend_from_slice(ev);
                s.extend_from_slice(sep);
                s.extend_from_slice(sep);
            }
            assert_eq!(
                payloads(&[&s]),
                vec![b"{\"a\":1}".to_vec(), b"[DONE]".to_vec()]
            );
        }
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let s = b": keepalive\r\nevent: x\r\ndata: {\"c\":\"\xc3\xa9\"}\r\nid: 3\r\n\r\ndata: a\r\ndata:b\r\n\r\ndata: [DONE]\r\n\r\n";
        let whole = frame_all(&[s]);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[1], (b"a\nb".to_vec(), 2));
        for i in 0..=s.len() {
            for j in i..=s.len() {
                assert_eq!(
                    frame_all(&[&s[..i], &s[i..j], &s[j..]]),
                    whole,
                    "split {i} {j}"
                );
            }
        }
    }

    #[test]
    fn cr_at_end_of_read_then_lf() {
        assert_eq!(
            payloads(&[b"data: 1\r", b"\n\r", b"\n"]),
            vec![b"1".to_vec()]
        );
        // A lone CR followed by a non-LF byte is a line end by itself.
        assert_eq!(payloads(&[b"data: 1\r", b"\r"]), vec![b"1".to_vec()]);
    }

    #[test]
    fn blank_lines_without_data_and_bare_data_field() {
        assert_eq!(
            payloads(&[b"\n\n: c\n\nretry: 5\n\n"]),
            Vec::<Vec<u8>>::new()
        );
        assert_eq!(payloads(&[b"data\n\n"]), vec![Vec::<u8>::new()]);
        assert_eq!(payloads(&[b"data:  x\n\n"]), vec![b" x".to_vec()]);
        assert_eq!(payloads(&[b"datax: 1\n\n"]), Vec::<Vec<u8>>::new());
    }

    #[test]
    fn stop_drops_the_rest() {
        let mut f = SseFramer::new();
        let mut n = 0;
        let r = f
            .feed(b"data: 1\n\ndata: 2\n\n", &mut |_: &[u8], _| {
                n += 1;
                false
            })
            .unwrap();
        assert!(!r);
        assert_eq!(n, 1);
    }

    #[test]
    fn oversized_event_fails() {
        let mut f = SseFramer::new();
        let big = vec![b'x'; MAX_EVENT_BYTES + 1];
        assert!(f.feed(&big, &mut |_: &[u8], _| true).is_err());
    }

    #[test]
    fn find_eol_matches_naive() {
        let s = b"abcdefghijklmnop\rqrstuvwxyz\n0123456789";
        for i in 0..s.len() {
            let naive = s[i..].iter().position(|&b| b == b'\n' || b == b'\r');
            assert_eq!(find_eol(&s[i..]), naive);
        }
        assert_eq!(find_eol(&[0x8a; 20]), None);
    }
}
