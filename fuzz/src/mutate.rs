//! Byte-level mutations biased towards the stream grammar: SSE framing bytes, JSON tokens,
//! token-ID shapes, hostile numbers and strings, and splices between seeds.

use crate::rng::Rng;

/// Fragments a mutation may insert or substitute.
const DICT: &[&[u8]] = &[
    b"data: ", b"data:", b"data", b"\n", b"\r", b"\r\n", b"\n\n", b"\r\n\r\n", b": c\n",
    b"event: e\n", b"[DONE]", b"data: [DONE]\n\n", b"{", b"}", b"[", b"]", b"\"", b",", b":",
    b"null", b"true", b"false", b"0", b"-1", b"-0", b"1e400", b"-1e400", b"1.5", b"NaN",
    b"18446744073709551616", b"9223372036854775808", b"-9223372036854775809",
    b"\"token_ids\":", b"\"token_ids\":[true]", b"\"token_ids\":null", b"\"token_ids\":[-3]",
    b"\"token_ids\":[1.0]", b"\"token_ids\":[\"1\"]", b"\"token_ids\":[[1]]", b"\"token_ids\":{}",
    b"\"prompt_token_ids\":[1,2]", b"\"prompt_token_ids\":7", b"\"choices\":[]",
    b"\"choices\":null", b"\"choices\":[{}]", b"\"delta\":{}", b"\"delta\":null",
    b"\"delta\":[]", b"\"content\":\"x\"", b"\"content\":1", b"\"content\":null",
    b"\"reasoning\":\"r\"", b"\"refusal\":\"no\"", b"\"role\":\"assistant\"",
    b"\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"{\"}}]",
    b"\"tool_calls\":[{\"index\":4294967296}]", b"\"tool_calls\":[{\"index\":-1}]",
    b"\"tool_calls\":[{}]", b"\"tool_calls\":null", b"\"function_call\":{\"name\":1}",
    b"\"logprobs\":{\"content\":[{\"token\":\"a\",\"logprob\":-1}]}", b"\"logprobs\":{}",
    b"\"logprobs\":{\"tokens\":[\"a\"],\"token_logprobs\":[null],\"text_offset\":[0]}",
    b"\"finish_reason\":\"stop\"", b"\"finish_reason\":7", b"\"stop_reason\":\"x\"",
    b"\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}",
    b"\"usage\":{\"completion_tokens\":-1}", b"\"usage\":null", b"\"usage\":[]",
    b"\"error\":{\"message\":\"m\",\"code\":500}", b"\"error\":null", b"\"error\":\"e\"",
    b"\"audio\":{\"id\":\"a\"}", b"\"annotations\":[{}]", b"\"index\":1", b"\"index\":-5",
    b"\"index\":99999999", b"\"text\":\"t\"", b"\"text\":null", b"\\u0000", b"\\ud800",
    b"\\udc00\\ud800", b"\\\"", b"\\\\", "é".as_bytes(), "😀".as_bytes(), b"\xff", b"\xc3",
    b"\xed\xa0\x80", b"\x00", b" ", b"\t",
];

/// Apply one (half the time) to five mutations to `data`, possibly splicing in `other`.
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let rounds = if rng.chance(2) { 1 } else { 2 + rng.below(4) };
    for _ in 0..rounds {
        one(rng, data, other);
    }
    if data.len() > 1 << 16 {
        data.truncate(1 << 16);
    }
}

fn one(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let len = data.len();
    let at = if len == 0 { 0 } else { rng.below(len + 1) };
    match rng.below(10) {
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = rng.next_u64() as u8;
        }
        2 => {
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, bytes);
        }
        3 if len > 0 => {
            let end = (at + 1 + rng.below(32)).min(len);
            data.drain(at.min(end)..end);
        }
        4 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(64)).min(len);
            let copy = data[start..end].to_vec();
            data.splice(at..at, copy);
        }
        5 if !other.is_empty() => {
            let start = rng.below(other.len());
            let end = (start + 1 + rng.below(256)).min(other.len());
            data.splice(at..at, other[start..end].iter().copied());
        }
        6 if len > 0 => {
            data.truncate(at);
        }
        7 | 8 => {
            let token = *rng.pick(DICT);
            if rng.chance(2) || len == 0 {
                data.splice(at..at, token.iter().copied());
            } else {
                let end = (at + 1 + rng.below(12)).min(len);
                data.splice(at.min(end)..end, token.iter().copied());
            }
        }
        _ => replace_number(rng, data),
    }
}

/// Replace one run of digits with a hostile number.
fn replace_number(rng: &mut Rng, data: &mut Vec<u8>) {
    let starts: Vec<usize> = (0..data.len())
        .filter(|&i| data[i].is_ascii_digit() && (i == 0 || !data[i - 1].is_ascii_digit()))
        .collect();
    if starts.is_empty() {
        return;
    }
    let start = *rng.pick(&starts);
    let mut end = start;
    while end < data.len() && data[end].is_ascii_digit() {
        end += 1;
    }
    let numbers: &[&[u8]] = &[
        b"0",
        b"-1",
        b"1e400",
        b"18446744073709551615",
        b"18446744073709551616",
        b"1.0",
        b"4294967296",
        b"-0",
        b"99999999999999999999999999999",
        b"true",
    ];
    data.splice(start..end, rng.pick(numbers).iter().copied());
}
