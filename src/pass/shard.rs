//! `--shard i/n`: root objects are partitioned by a stable hash of their key, so an Indexed Job
//! can run n pods in parallel and no two of them ever write the same status.

use sha2::{Digest, Sha256};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("invalid shard {s:?}: expected i/n, e.g. 0/4"))?;
        let index: u32 = i
            .trim()
            .parse()
            .map_err(|_| format!("invalid shard index {i:?}"))?;
        let count: u32 = n
            .trim()
            .parse()
            .map_err(|_| format!("invalid shard count {n:?}"))?;
        if count == 0 || index >= count {
            return Err(format!("invalid shard {s:?}: need 0 <= i < n"));
        }
        Ok(Self { index, count })
    }

    /// Whether the root object with this key (e.g. `namespace/name`) belongs to this shard.
    pub fn owns(&self, key: &str) -> bool {
        shard_of(key, self.count) == self.index
    }

    /// Suffix for the pass Lease name: `-i-of-n`.
    pub fn lease_suffix(&self) -> String {
        format!("-{}-of-{}", self.index, self.count)
    }
}

/// Stable across runs, processes and architectures (unlike std's hasher).
pub fn shard_of(key: &str, count: u32) -> u32 {
    let digest = Sha256::digest(key.as_bytes());
    let v = u64::from_be_bytes([
        digest[0], digest[1], digest[2], digest[3], digest[4], digest[5], digest[6], digest[7],
    ]);
    (v % u64::from(count.max(1))) as u32
}

/// `Option<Shard>` semantics: no shard owns everything.
pub fn owns(shard: Option<Shard>, key: &str) -> bool {
    shard.is_none_or(|s| s.owns(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_table() {
        assert_eq!(Shard::parse("0/4").unwrap(), Shard { index: 0, count: 4 });
        assert_eq!(Shard::parse("3/4").unwrap().lease_suffix(), "-3-of-4");
        for bad in ["4/4", "1", "a/2", "0/0", "-1/2"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_key_in_exactly_one_shard_and_stable() {
        let shards: Vec<Shard> = (0..4).map(|i| Shard { index: i, count: 4 }).collect();
        let mut per = [0u32; 4];
        for k in 0..1000 {
            let key = format!("ns-{k}/obj");
            let owners: Vec<_> = shards.iter().filter(|s| s.owns(&key)).collect();
            assert_eq!(owners.len(), 1);
            per[owners[0].index as usize] += 1;
        }
        // A stable hash spreads keys; each shard gets a fair share.
        assert!(per.iter().all(|&n| n > 150), "{per:?}");
        // Pinned value: changing the hash would silently move every object between shards.
        assert_eq!(
            (shard_of("team-a/widgets", 4), shard_of("team-a/widgets", 7)),
            (3, 2)
        );
        assert_eq!((shard_of("c/b", 4), shard_of("c/b", 7)), (2, 1));
        assert_eq!((shard_of("ns-7/db", 4), shard_of("ns-7/db", 7)), (1, 5));
        assert!(owns(None, "anything"));
    }
}
