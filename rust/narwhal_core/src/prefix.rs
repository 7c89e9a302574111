//! Per-engine prefix index: which leading blocks of a prompt each engine probably holds in
//! its prefix (KV) cache.
//!
//! A prompt's text is cut into chunks of `chunk_bytes` bytes (full chunks only); each chunk
//! is named by a 64-bit hash chained to its parent's, so one hash names one path from the
//! root of a radix tree over chunks, and a prompt's match on an engine is its run of leading
//! chunk hashes the engine holds. Hash collisions make the tree approximate, never unsafe.
//! Each engine keeps at most `capacity` hashes, evicted least recently placed first: the
//! order the engine's own LRU cache ages its blocks in. Memory: about 48 bytes per hash.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// The keys are hashes already: use them as they are.
#[derive(Default)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

type HashTicks = HashMap<u64, u64, BuildHasherDefault<Identity>>;

const SEED: u64 = 0xcbf2_9ce4_8422_2325;
const MUL: u64 = 0x9e37_79b9_7f4a_7c15;
const FIN: u64 = 0xff51_afd7_ed55_8ccd;

/// The chained hashes of `text`'s full chunks (`chunk_bytes` is rounded up to 8).
pub fn chunk_hashes(text: &[u8], chunk_bytes: usize) -> Vec<u64> {
    let chunk = chunk_bytes.max(8).div_ceil(8) * 8;
    let mut out = Vec::with_capacity(text.len() / chunk);
    let mut parent = SEED;
    for block in text.chunks_exact(chunk) {
        let mut h = parent;
        for word in block.chunks_exact(8) {
            let w = u64::from_le_bytes(word.try_into().expect("8-byte word"));
            h = (h ^ w).wrapping_mul(MUL);
            h ^= h >> 32;
        }
        h ^= h >> 29;
        h = h.wrapping_mul(FIN);
        h ^= h >> 32;
        out.push(h);
        parent = h;
    }
    out
}

/// One engine's held hashes, least recently placed first.
#[derive(Debug, Default)]
struct Held {
    capacity: usize,
    tick: u64,
    last: HashTicks,             // hash -> tick of its last placement
    order: VecDeque<(u64, u64)>, // (hash, tick) in placement order; stale when ticks differ
    placed_chunks: u64,
    matched_chunks: u64,
}

impl Held {
    fn matched(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.last.contains_key(h))
            .count()
    }

    fn insert(&mut self, hashes: &[u64]) -> usize {
        let matched = self.matched(hashes);
        self.placed_chunks += hashes.len() as u64;
        self.matched_chunks += matched as u64;
        if self.capacity == 0 {
            return matched;
        }
        // A prompt longer than the cache keeps its last `capacity` chunks, as the engine's
        // LRU would after computing it.
        let start = hashes.len().saturating_sub(self.capacity);
        for &h in &hashes[start..] {
            self.tick += 1;
            self.last.insert(h, self.tick);
            self.order.push_back((h, self.tick));
        }
        self.evict();
        matched
    }

    fn evict(&mut self) {
        while self.last.len() > self.capacity {
            match self.order.pop_front() {
                Some((h, t)) if self.last.get(&h) == Some(&t) => {
                    self.last.remove(&h);
                }
                Some(_) => {}
                None => break,
            }
        }
        if self.order.len() > 2 * self.capacity + 64 {
            let last = &self.last;
            self.order.retain(|(h, t)| last.get(h) == Some(t));
        }
    }

    fn forget(&mut self, hashes: &[u64]) {
        for h in hashes {
            self.last.remove(h);
        }
    }
}

/// The prefix index of every engine.
#[derive(Debug)]
pub struct PrefixIndex {
    chunk_bytes: usize,
    engines: Vec<Held>,
}

/// Per-engine exported state: hashes held, capacity, chunks placed and of them matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldState {
    pub blocks: usize,
    pub capacity: usize,
    pub placed_chunks: u64,
    pub matched_chunks: u64,
}

impl PrefixIndex {
    /// One engine per capacity (hashes it may hold; 0: it holds none).
    pub fn new(capacities: &[usize], chunk_bytes: usize) -> Self {
        PrefixIndex {
            chunk_bytes: chunk_bytes.max(8).div_ceil(8) * 8,
            engines: capacities
                .iter()
                .map(|&capacity| Held {
                    capacity,
                    ..Held::default()
                })
                .collect(),
        }
    }

    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    pub fn engines(&self) -> usize {
        self.engines.len()
    }

    pub fn hashes(&self, text: &[u8]) -> Vec<u64> {
        chunk_hashes(text, self.chunk_bytes)
    }

    /// Leading chunks of `hashes` each engine holds (an engine out of range holds none).
    pub fn matched(&self, engine: usize, hashes: &[u64]) -> usize {
        self.engines
            .get(engine)
            .map_or(0, |held| held.matched(hashes))
    }

    /// Record a placement on `engine`; return the chunks it held before.
    pub fn insert(&mut self, engine: usize, hashes: &[u64]) -> usize {
        self.engines
            .get_mut(engine)
            .map_or(0, |held| held.insert(hashes))
    }

    /// The engine reported holding less: forget these hashes there.
    pub fn forget(&mut self, engine: usize, hashes: &[u64]) {
        if let Some(held) = self.engines.get_mut(engine) {
            held.forget(hashes);
        }
    }

    /// A new engine in slot `engine` (the index grows to hold it): it holds nothing yet.
    pub fn reset(&mut self, engine: usize, capacity: usize) {
        if engine >= self.engines.len() {
            self.engines.resize_with(engine + 1, Held::default);
        }
        self.engines[engine] = Held {
            capacity,
            ..Held::default()
        };
    }

    pub fn set_capacity(&mut self, engine: usize, capacity: usize) {
        if let Some(held) = self.engines.get_mut(engine) {
            held.capacity = capacity;
            held.evict();
        }
    }

    pub fn state(&self, engine: usize) -> Option<HeldState> {
        self.engines.get(engine).map(|held| HeldState {
            blocks: held.last.len(),
            capacity: held.capacity,
            placed_chunks: held.placed_chunks,
            matched_chunks: held.matched_chunks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize, salt: u8) -> Vec<u8> {
        (0..n)
            .map(|i| b'a' + ((i as u8).wrapping_add(salt) % 26))
            .collect()
    }

    #[test]
    fn hashes_chain_and_skip_the_partial_chunk() {
        let a = text(200, 0);
        let hashes = chunk_hashes(&a, 64);
        assert_eq!(hashes.len(), 3);
        assert_eq!(chunk_hashes(&a[..128], 64), hashes[..2]);
        let mut b = a.clone();
        b[0] = b'Z';
        let other = chunk_hashes(&b, 64);
        assert!(other.iter().zip(&hashes).all(|(x, y)| x != y));
        assert_eq!(chunk_hashes(&a, 60), hashes); // rounded up to 64
    }

    #[test]
    fn insert_matches_leading_chunks_only() {
        let mut index = PrefixIndex::new(&[100, 100], 64);
        let a = index.hashes(&text(640, 0));
        assert_eq!(index.insert(0, &a), 0);
        assert_eq!(index.matched(0, &a), 10);
        assert_eq!(index.matched(1, &a), 0);
        assert_eq!(index.matched(7, &a), 0);
        let mut b = text(640, 0);
        b[200] = b'#';
        let b = index.hashes(&b);
        assert_eq!(index.matched(0, &b), 3);
        assert_eq!(index.insert(0, &b), 3);
        let s = index.state(0).unwrap();
        assert_eq!((s.blocks, s.placed_chunks, s.matched_chunks), (17, 20, 3));
    }

    #[test]
    fn lru_evicts_least_recently_placed_and_stays_bounded() {
        let mut index = PrefixIndex::new(&[8], 8);
        let a = index.hashes(&text(32, 1)); // 4 chunks
        let b = index.hashes(&text(32, 2));
        let c = index.hashes(&text(32, 3));
        index.insert(0, &a);
        index.insert(0, &b);
        index.insert(0, &a); // a is recent again
        index.insert(0, &c); // evicts b
        assert_eq!(index.matched(0, &a), 4);
        assert_eq!(index.matched(0, &b), 0);
        for salt in 0..200 {
            index.insert(0, &index.hashes(&text(64, salt)));
        }
        assert_eq!(index.state(0).unwrap().blocks, 8);
        assert!(index.engines[0].order.len() <= 2 * 8 + 64 + 8);
    }

    #[test]
    fn a_prompt_longer_than_the_cache_keeps_its_tail_and_forget_drops() {
        let mut index = PrefixIndex::new(&[4, 0], 8);
        let a = index.hashes(&text(80, 0)); // 10 chunks
        index.insert(0, &a);
        assert_eq!(index.matched(0, &a), 0);
        assert_eq!(index.state(0).unwrap().blocks, 4);
        index.insert(1, &a);
        assert_eq!(index.state(1).unwrap().blocks, 0);
        let mut index = PrefixIndex::new(&[100], 8);
        index.insert(0, &a);
        index.forget(0, &a[3..]);
        assert_eq!(index.matched(0, &a), 3);
        index.set_capacity(0, 2);
        assert_eq!(index.state(0).unwrap().blocks, 2);
    }

    #[test]
    fn reset_grows_the_index_and_forgets_the_slot() {
        let mut index = PrefixIndex::new(&[8], 8);
        let hashes = index.hashes(b"0123456789abcdef0123456789abcdef");
        index.insert(0, &hashes);
        assert_eq!(index.matched(0, &hashes), hashes.len());
        index.reset(2, 8);
        assert_eq!(index.engines(), 3);
        assert_eq!(index.matched(1, &hashes), 0);
        index.insert(2, &hashes);
        assert_eq!(index.matched(2, &hashes), hashes.len());
        index.reset(0, 8);
        assert_eq!(index.matched(0, &hashes), 0);
        assert_eq!(index.state(0).map(|s| s.placed_chunks), Some(0));
    }
}
