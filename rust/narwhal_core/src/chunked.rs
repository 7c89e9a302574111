//! HTTP/1.1 chunked transfer-coding: decoding an engine's response body, framing the client's.

use thiserror::Error;

/// Longest chunk-size line (size, extensions) accepted; llhttp has no such limit, but a
/// size line this long is no engine's.
pub const MAX_SIZE_LINE: usize = 4096;
/// Most trailer bytes accepted after the last chunk.
pub const MAX_TRAILERS: usize = 65536;

/// Why an engine's chunked body cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChunkError {
    #[error("invalid chunk size")]
    Size,
    #[error("chunk size line too long")]
    SizeLine,
    #[error("chunk data not followed by CRLF")]
    DataEnd,
    #[error("invalid trailer section")]
    Trailer,
    #[error("bytes after the end of the body")]
    AfterEnd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum St {
    /// At the first hex digit of a size line.
    #[default]
    SizeStart,
    /// In the size's hex digits.
    Size,
    /// After the digits: whitespace and `;extensions`, up to CR.
    Ext,
    /// CR of the size line seen.
    SizeLf,
    /// In a chunk's data.
    Data,
    /// Data done: its CR.
    DataCr,
    /// Data done: its LF.
    DataLf,
    /// At the start of a trailer line (or of the final empty line).
    TrailerStart,
    /// In a trailer line.
    Trailer,
    /// CR of a trailer line seen.
    TrailerLf,
    /// CR of the final empty line seen.
    EndLf,
    /// The last chunk and its trailers are complete.
    Done,
}

/// Incremental decoder of one chunked body, fed reads split anywhere.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    st: St,
    /// Data bytes left in the current chunk (the size while in the size line).
    remaining: u64,
    /// Bytes of the current size line, or of the trailers so far.
    seen: usize,
}

impl ChunkedDecoder {
    /// A decoder at the start of a chunk-size line (the start of a body, or a chunk boundary).
    pub fn new() -> Self {
        Self::default()
    }

    /// The last chunk and its trailers have been read.
    pub fn is_done(&self) -> bool {
        self.st == St::Done
    }

    /// Decode one read, calling `on_data` with each piece of chunk data in order. Bytes
    /// after the end of the body are an error (`AfterEnd`, with `is_done()` true).
    pub fn feed<F: FnMut(&[u8])>(
        &mut self,
        input: &[u8],
        on_data: &mut F,
    ) -> Result<(), ChunkError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.st {
                St::Data => {
                    let take = (input.len() - i)
                        .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
                    on_data(&input[i..i + take]);
                    i += take;
                    self.remaining -= take as u64;
                    if self.remaining == 0 {
                        self.st = St::DataCr;
                    }
                    continue;
                }
                St::SizeStart | St::Size => match hex(b) {
                    Some(d) => {
                        if self.remaining >> 60 != 0 {
                            return Err(ChunkError::Size);
                        }
                        self.remaining = self.remaining << 4 | u64::from(d);
                        self.st = St::Size;
                        self.line_byte()?;
                    }
                    None if self.st == St::SizeStart => return Err(ChunkError::Size),
                    None => match b {
                        b'\r' => self.st = St::SizeLf,
                        b';' | b' ' | b'\t' => {
                            self.st = St::Ext;
                            self.line_byte()?;
                        }
                        _ => return Err(ChunkError::Size),
                    },
                },
                St::Ext => match b {
                    b'\r' => self.st = St::SizeLf,
                    b'\n' | 0 => return Err(ChunkError::Size),
                    _ => self.line_byte()?,
                },
                St::SizeLf => {
                    if b != b'\n' {
                        return Err(ChunkError::Size);
                    }
                    self.seen = 0;
                    self.st = if self.remaining == 0 {
                        St::TrailerStart
                    } else {
                        St::Data
                    };
                }
                St::DataCr => {
                    if b != b'\r' {
                        return Err(ChunkError::DataEnd);
                    }
                    self.st = St::DataLf;
                }
                St::DataLf => {
                    if b != b'\n' {
                        return Err(ChunkError::DataEnd);
                    }
                    self.st = St::SizeStart;
                }
                St::TrailerStart => match b {
                    b'\r' => self.st = St::EndLf,
                    b'\n' | 0 => return Err(ChunkError::Trailer),
                    _ => {
                        self.st = St::Trailer;
                        self.trailer_byte()?;
                    }
                },
                St::Trailer => match b {
                    b'\r' => self.st = St::TrailerLf,
                    b'\n' | 0 => return Err(ChunkError::Trailer),
                    _ => self.trailer_byte()?,
                },
                St::TrailerLf | St::EndLf => {
                    if b != b'\n' {
                        return Err(ChunkError::Trailer);
                    }
                    self.st = if self.st == St::EndLf {
                        St::Done
                    } else {
                        St::TrailerStart
                    };
                }
                St::Done => return Err(ChunkError::AfterEnd),
            }
            i += 1;
        }
        Ok(())
    }

    fn line_byte(&mut self) -> Result<(), ChunkError> {
        self.seen += 1;
        if self.seen > MAX_SIZE_LINE {
            return Err(ChunkError::SizeLine);
        }
        Ok(())
    }

    fn trailer_byte(&mut self) -> Result<(), ChunkError> {
        self.seen += 1;
        if self.seen > MAX_TRAILERS {
            return Err(ChunkError::Trailer);
        }
        Ok(())
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Append `data` to `out` as one chunk of a chunked body (nothing for empty `data`: an empty
/// chunk would end the body).
pub fn frame_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let mut n = data.len();
    let mut digits = [0u8; 16];
    let mut k = digits.len();
    while n > 0 || k == digits.len() {
        k -= 1;
        digits[k] = b"0123456789abcdef"[n & 15];
        n >>= 4;
    }
    out.reserve(digits.len() - k + data.len() + 4);
    out.extend_from_slice(&digits[k..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(reads: &[&[u8]]) -> (Vec<u8>, Result<(), ChunkError>, bool) {
        let mut d = ChunkedDecoder::new();
        let mut body = Vec::new();
        for r in reads {
            if let Err(e) = d.feed(r, &mut |p: &[u8]| body.extend_from_slice(p)) {
                return (body, Err(e), d.is_done());
            }
        }
        (body, Ok(()), d.is_done())
    }

    #[test]
    fn decodes_at_every_split_point() {
        let wire: &[u8] =
            b"5\r\nhello\r\n1A;name=\"v\"\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-t: 1\r\n\r\n";
        let want = b"helloabcdefghijklmnopqrstuvwxyz".to_vec();
        for i in 0..=wire.len() {
            for j in i..=wire.len() {
                let (body, r, done) = decode(&[&wire[..i], &wire[i..j], &wire[j..]]);
                assert_eq!((body.as_slice(), r, done), (want.as_slice(), Ok(()), true));
            }
        }
    }

    #[test]
    fn malformed_framing_is_an_error() {
        for (wire, err) in [
            (&b"x\r\n"[..], ChunkError::Size),
            (b"\r\n", ChunkError::Size),
            (b"5\nhello\r\n", ChunkError::Size),
            (b"5\r\nhelloX", ChunkError::DataEnd),
            (b"5\r\nhello\rX", ChunkError::DataEnd),
            (b"11111111111111111\r\n", ChunkError::Size),
            (b"0\r\nbad\n", ChunkError::Trailer),
            (b"0\r\n\rX", ChunkError::Trailer),
        ] {
            assert_eq!(
                decode(&[wire]).1,
                Err(err),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
        let (_, r, done) = decode(&[b"0\r\n\r\nHTTP"]);
        assert_eq!((r, done), (Err(ChunkError::AfterEnd), true));
        let long = [&b"1;"[..], &[b'x'; MAX_SIZE_LINE]].concat();
        assert_eq!(decode(&[&long]).1, Err(ChunkError::SizeLine));
    }

    #[test]
    fn frames_chunks() {
        let mut out = Vec::new();
        frame_chunk(&mut out, b"");
        frame_chunk(&mut out, b"hi");
        frame_chunk(&mut out, &[b'a'; 300]);
        let want = [&b"2\r\nhi\r\n12c\r\n"[..], &[b'a'; 300], b"\r\n"].concat();
        assert_eq!(out, want);
    }
}
