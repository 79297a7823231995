//! A small, fast hasher for the crate's in-process maps, whose keys are our own numbers and
//! key names (never attacker-chosen), so SipHash's flooding resistance buys nothing there.

use std::hash::{BuildHasherDefault, Hasher};

/// The Fx hash (as used by rustc): a multiply and a rotate per word.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// A `HashMap` with [`FxHasher`].
pub(crate) type FastHashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_keys_hash_apart_and_maps_work() {
        let mut m: FastHashMap<(u64, String), u32> = FastHashMap::default();
        for i in 0..1000u32 {
            m.insert((u64::from(i % 3), format!("lock:{i}")), i);
        }
        assert_eq!(m.len(), 1000);
        assert_eq!(m.get(&(1, "lock:7".to_owned())), Some(&7));
        let h = |s: &str| {
            let mut h = FxHasher::default();
            h.write(s.as_bytes());
            h.finish()
        };
        assert_ne!(h("redmutex:{a}"), h("redmutex:{b}"));
    }
}
