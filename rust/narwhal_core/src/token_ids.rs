//! Token-ID validation and counting: a raw `token_ids` value must be a list of u64 integers.

use serde_json::value::RawValue;

use crate::delta::Kind;
use crate::error::StreamError;

/// A validated ID list: how many IDs, and the bytes between its brackets (for concatenation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdList<'a> {
    pub count: u64,
    pub inner: &'a [u8],
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// What is wrong with one element, given the element's first byte and its number token.
fn element_problem(b: &[u8], start: usize) -> Result<usize, String> {
    match b[start] {
        b't' => Err("is a Boolean (true), not an integer".into()),
        b'f' => Err("is a Boolean (false), not an integer".into()),
        b'n' => Err("is null, not an integer".into()),
        b'"' => Err("is a string, not an integer".into()),
        b'[' => Err("is a nested list, not an integer".into()),
        b'{' => Err("is an object, not an integer".into()),
        _ => {
            let mut end = start;
            while end < b.len() && matches!(b[end], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
            {
                end += 1;
            }
            let tok = &b[start..end];
            let text = String::from_utf8_lossy(tok);
            if tok.iter().any(|&c| matches!(c, b'.' | b'e' | b'E')) {
                return Err(format!("is not an integer ({text})"));
            }
            let (neg, digits) = match tok.split_first() {
                Some((b'-', d)) => (true, d),
                _ => (false, tok),
            };
            if neg && digits.iter().any(|&c| c != b'0') {
                return Err(format!("is negative ({text})"));
            }
            let mut v: u64 = 0;
            for &c in digits {
                v = v
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(u64::from(c - b'0')))
                    .ok_or_else(|| format!("exceeds the 64-bit range ({text})"))?;
            }
            Ok(end)
        }
    }
}

/// Validate a raw `token_ids` (or `prompt_token_ids`) value that is not null. `what` names
/// the field in messages. The raw value comes from a parsed event, so it is valid JSON.
pub fn validate<'a>(raw: &'a RawValue, what: &str) -> Result<IdList<'a>, StreamError> {
    let b = raw.get().as_bytes();
    let kind = Kind::of(raw);
    if kind != Kind::List {
        return Err(StreamError::malformed(format!(
            "{what} must be a list of nonnegative integers, got {}",
            kind.noun()
        )));
    }
    let mut count = 0u64;
    let mut i = skip_ws(b, 1);
    if b[i] != b']' {
        loop {
            i = element_problem(b, i)
                .map_err(|p| StreamError::malformed(format!("{what}[{count}] {p}")))?;
            count += 1;
            i = skip_ws(b, i);
            if b[i] == b']' {
                break;
            }
            i = skip_ws(b, i + 1); // the comma
        }
    }
    let inner = if count == 0 {
        &b[..0]
    } else {
        &b[1..b.len() - 1]
    };
    Ok(IdList { count, inner })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(s: &str) -> Result<u64, String> {
        let raw: &RawValue = serde_json::from_str(s).unwrap();
        validate(raw, "token_ids")
            .map(|l| l.count)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn good_lists_count() {
        assert_eq!(check("[]"), Ok(0));
        assert_eq!(check("[ ]"), Ok(0));
        assert_eq!(check("[668]"), Ok(1));
        assert_eq!(check("[1, 2 ,3]"), Ok(3));
        assert_eq!(check("[0,18446744073709551615]"), Ok(2));
        assert_eq!(check("[-0]"), Ok(1)); // JSON -0 is the integer 0
    }

    #[test]
    fn each_failure_kind_is_named() {
        let cases = [
            ("[true]", "token_ids[0] is a Boolean (true)"),
            ("[1,false]", "token_ids[1] is a Boolean (false)"),
            ("[1,-2]", "token_ids[1] is negative (-2)"),
            ("[1.0]", "token_ids[0] is not an integer (1.0)"),
            ("[1e3]", "token_ids[0] is not an integer (1e3)"),
            ("[-1.5]", "token_ids[0] is not an integer (-1.5)"),
            ("[\"5\"]", "token_ids[0] is a string"),
            ("[[1]]", "token_ids[0] is a nested list"),
            ("[{}]", "token_ids[0] is an object"),
            ("[null]", "token_ids[0] is null"),
            (
                "[18446744073709551616]",
                "token_ids[0] exceeds the 64-bit range",
            ),
            (
                "5",
                "token_ids must be a list of nonnegative integers, got a number",
            ),
            ("true", "got a Boolean"),
            ("\"[1]\"", "got a string"),
            ("{}", "got an object"),
        ];
        for (s, want) in cases {
            let got = check(s).unwrap_err();
            assert!(got.contains(want), "{s}: {got}");
        }
    }

    #[test]
    fn inner_bytes_for_concatenation() {
        let raw: &RawValue = serde_json::from_str("[1,2]").unwrap();
        assert_eq!(validate(raw, "t").unwrap().inner, b"1,2");
    }
}
