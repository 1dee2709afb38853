//! Prefix-aware balancing: llama-server keeps each slot's prompt in its KV cache, so the next turn
//! of a conversation is cheapest on the replica that served the turn before. A prompt is hashed in
//! chained fixed-size blocks (each block's hash covers every byte before it, as vLLM and llm-d do),
//! and each pool remembers which replica last served each block hash.

use std::hash::{DefaultHasher, Hasher};

use hashlink::LruCache;

/// Bytes of prompt text per block: small enough that a new turn shares all but its last blocks,
/// large enough that a long conversation stays a few hundred hashes.
pub const BLOCK_BYTES: usize = 256;

/// Block hashes remembered per pool. Each entry is a `u64` hash and a member index in a linked
/// hash map (about 48 bytes with its links and table slot), so a full memory is about 3 MiB.
pub const MEMORY_ENTRIES: usize = 64 * 1024;

/// A request's prompt as chained block hashes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefix {
    /// One hash per block, the last block possibly short; hash `k` covers blocks `0..=k`.
    pub hashes: Vec<u64>,
    /// The prompt's length in bytes.
    pub len: usize,
}

impl Prefix {
    /// Hashes `text` in blocks of [`BLOCK_BYTES`].
    pub fn of(text: &[u8]) -> Prefix {
        Prefix::with_block(text, BLOCK_BYTES)
    }

    fn with_block(text: &[u8], block: usize) -> Prefix {
        let mut chain = 0u64;
        let hashes = text
            .chunks(block)
            .map(|chunk| {
                // a fixed-key SipHash: the same text hashes the same for the life of the process
                let mut h = DefaultHasher::new();
                h.write_u64(chain);
                h.write(chunk);
                chain = h.finish();
                chain
            })
            .collect();
        Prefix {
            hashes,
            len: text.len(),
        }
    }

    /// Bytes covered by the first `blocks` blocks.
    pub fn bytes_in(&self, blocks: usize) -> usize {
        (blocks * BLOCK_BYTES).min(self.len)
    }
}

/// Where a pool's prefixes were last served: block hash to member index, least recently used
/// dropped first once [`MEMORY_ENTRIES`] are held.
pub struct PrefixMemory {
    lru: LruCache<u64, usize>,
}

/// The replica holding the longest remembered prefix of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub member: usize,
    /// Blocks of the request that replica last served.
    pub blocks: usize,
}

impl Default for PrefixMemory {
    fn default() -> Self {
        PrefixMemory::with_capacity(MEMORY_ENTRIES)
    }
}

impl PrefixMemory {
    pub fn with_capacity(entries: usize) -> PrefixMemory {
        PrefixMemory {
            lru: LruCache::new(entries),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lru.len()
    }

    /// The longest remembered prefix: since hashes are chained, the last known hash is the longest
    /// match, and the replica that served it holds every block before it too.
    pub fn longest(&self, prefix: &Prefix) -> Option<Holder> {
        prefix.hashes.iter().enumerate().rev().find_map(|(k, h)| {
            self.lru.peek(h).map(|m| Holder {
                member: *m,
                blocks: k + 1,
            })
        })
    }

    /// Records that `member` now holds every block of `prefix`.
    pub fn record(&mut self, prefix: &Prefix, member: usize) {
        for h in &prefix.hashes {
            self.lru.insert(*h, member);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_prefix_gives_shared_leading_hashes() {
        let a = Prefix::with_block(b"aaaabbbbccccdd", 4);
        let b = Prefix::with_block(b"aaaabbbbccccxxxxyy", 4);
        assert_eq!(a.hashes.len(), 4);
        assert_eq!(b.hashes.len(), 5);
        assert_eq!(a.hashes[..3], b.hashes[..3]);
        assert_ne!(a.hashes[3], b.hashes[3]);
    }

    #[test]
    fn a_change_in_block_k_changes_hashes_from_k_on() {
        let a = Prefix::with_block(b"aaaabbbbccccdddd", 4);
        let b = Prefix::with_block(b"aaaabXbbccccdddd", 4);
        assert_eq!(a.hashes[0], b.hashes[0]);
        for k in 1..4 {
            assert_ne!(a.hashes[k], b.hashes[k], "block {k}");
        }
    }

    #[test]
    fn the_same_block_at_another_place_hashes_differently() {
        let a = Prefix::with_block(b"xxxxyyyy", 4);
        let b = Prefix::with_block(b"yyyyxxxx", 4);
        assert_ne!(a.hashes[1], b.hashes[0]);
    }

    #[test]
    fn matched_bytes_stop_at_the_prompt_end() {
        let p = Prefix::of(&[b'a'; 600]);
        assert_eq!(p.hashes.len(), 3);
        assert_eq!(p.bytes_in(2), 512);
        assert_eq!(p.bytes_in(3), 600);
    }

    #[test]
    fn the_longest_match_names_its_replica() {
        let mut memory = PrefixMemory::default();
        let first = Prefix::with_block(b"aaaabbbb", 4);
        let longer = Prefix::with_block(b"aaaabbbbcccc", 4);
        memory.record(&first, 0);
        assert_eq!(
            memory.longest(&longer),
            Some(Holder {
                member: 0,
                blocks: 2
            })
        );
        memory.record(&longer, 1);
        assert_eq!(
            memory.longest(&longer),
            Some(Holder {
                member: 1,
                blocks: 3
            })
        );
        assert_eq!(memory.longest(&Prefix::with_block(b"zzzz", 4)), None);
    }

    #[test]
    fn the_memory_keeps_to_its_bound_and_drops_the_least_recently_used() {
        let mut memory = PrefixMemory::with_capacity(8);
        let old = Prefix::with_block(b"oldoldol", 4);
        memory.record(&old, 0);
        for i in 0..20u8 {
            memory.record(&Prefix::with_block(&[i; 8], 4), 1);
            assert!(memory.len() <= 8);
        }
        assert_eq!(memory.len(), 8);
        assert_eq!(memory.longest(&old), None);
    }
}
