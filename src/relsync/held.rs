//! What SpiceDB held for a source's scope objects when its walk began, read in one export
//! stream per object type and kept compact: each object's relationships as one string of
//! `relation subject_type:subject_id` lines. A source with 200k relationships would hold ~70 MB
//! as [`Rel`]s (five strings each); as text it is ~40 bytes a relationship. A scope's
//! relationships become [`Rel`]s only while that scope is diffed (docs/performance.md "relsync").

use std::collections::{BTreeSet, HashMap};

use super::spicedb::{Collect, Obj, Rel, RelRef};

/// Relationships by object type, then object id.
#[derive(Debug, Default)]
pub struct Held {
    by_type: HashMap<String, HashMap<String, String>>,
    count: usize,
}

impl Held {
    /// How many relationships it holds.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The relationships of one object, none when it held none.
    pub fn of(&self, obj: &Obj) -> Vec<Rel> {
        self.by_type
            .get(&obj.kind)
            .and_then(|ids| ids.get(&obj.id))
            .map(|text| expand(obj, text))
            .unwrap_or_default()
    }

    /// Every relationship of objects of `kind` not in `keep` (what a reap may sweep).
    pub fn outside(&self, kind: &str, keep: &BTreeSet<Obj>) -> Vec<Rel> {
        let Some(ids) = self.by_type.get(kind) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (id, text) in ids {
            let obj = Obj::new(kind, id.clone());
            if !keep.contains(&obj) {
                out.extend(expand(&obj, text));
            }
        }
        out
    }

    /// Add another read's relationships (of other object types).
    pub fn merge(&mut self, other: Held) {
        for (kind, ids) in other.by_type {
            self.by_type.entry(kind).or_default().extend(ids);
        }
        self.count += other.count;
    }

    /// Give back what the strings grew into while reading.
    pub fn shrink(&mut self) {
        for ids in self.by_type.values_mut() {
            for text in ids.values_mut() {
                text.shrink_to_fit();
            }
            ids.shrink_to_fit();
        }
    }
}

impl Collect for Held {
    fn restart(&mut self) {
        self.by_type.clear();
        self.count = 0;
    }

    fn push(&mut self, r: RelRef<'_>) {
        let ids = match self.by_type.get_mut(r.resource_type) {
            Some(ids) => ids,
            None => self.by_type.entry(r.resource_type.to_string()).or_default(),
        };
        let text = match ids.get_mut(r.resource_id) {
            Some(text) => text,
            None => ids.entry(r.resource_id.to_string()).or_default(),
        };
        // Relation names, types and ids never contain a space, a colon in the id's place or
        // a newline (SpiceDB's grammar), so the line splits back unambiguously.
        text.push_str(r.relation);
        text.push(' ');
        text.push_str(r.subject_type);
        text.push(':');
        text.push_str(r.subject_id);
        text.push('\n');
        self.count += 1;
    }
}

fn expand(obj: &Obj, text: &str) -> Vec<Rel> {
    text.lines()
        .filter_map(|line| {
            let (relation, subject) = line.split_once(' ')?;
            let (kind, id) = subject.split_once(':')?;
            Some(Rel {
                resource: obj.clone(),
                relation: relation.to_string(),
                subject: Obj::new(kind, id),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(obj: &str, relation: &str, subject: &str) -> Rel {
        let (rk, ri) = obj.split_once(':').unwrap();
        let (sk, si) = subject.split_once(':').unwrap();
        Rel {
            resource: Obj::new(rk, ri),
            relation: relation.into(),
            subject: Obj::new(sk, si),
        }
    }

    fn push(h: &mut Held, r: &Rel) {
        h.push(RelRef::from(r));
    }

    #[test]
    fn gives_back_each_objects_relationships_exactly() {
        let rels = [
            rel(
                "slack_channel:ns/s/C1",
                "member",
                "user:ada+40example+2Ecom",
            ),
            rel(
                "slack_channel:ns/s/C1",
                "workspace",
                "slack_workspace:ns/s/T1",
            ),
            rel("slack_channel:ns/s/C2", "member", "user:u-1"),
            rel("slack_usergroup:ns/s/C1", "member", "user:u-2"),
        ];
        let mut h = Held::default();
        for r in &rels {
            push(&mut h, r);
        }
        h.shrink();
        assert_eq!(h.len(), 4);
        assert_eq!(h.of(&rels[0].resource), rels[..2].to_vec());
        assert_eq!(h.of(&rels[2].resource), rels[2..3].to_vec());
        // Same id, another type: its own object.
        assert_eq!(h.of(&rels[3].resource), rels[3..].to_vec());
        assert!(h.of(&Obj::new("slack_channel", "ns/s/C9")).is_empty());
        let keep = BTreeSet::from([rels[0].resource.clone()]);
        assert_eq!(h.outside("slack_channel", &keep), rels[2..3].to_vec());
        assert!(h.outside("scim_group", &keep).is_empty());
    }

    #[test]
    fn a_restarted_read_starts_empty() {
        let mut h = Held::default();
        push(&mut h, &rel("slack_channel:a/b/C1", "member", "user:u"));
        h.restart();
        assert!(h.is_empty());
        assert!(h.of(&Obj::new("slack_channel", "a/b/C1")).is_empty());
    }
}
