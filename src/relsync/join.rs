//! The identity join (docs/relsync.md "One source, one pass"): an upstream member becomes a platform user
//! `user:<id>` by email. Without a directory the id is the encoded, lower-cased email; with one
//! (a ConfigMap key holding a map of email → user id) the mapped id. Members without an email,
//! bots (including `USLACKBOT`), deleted or inactive users, users the upstream cannot describe,
//! and emails missing from the directory are join misses: counted, never written.

use std::collections::HashMap;

use super::encode::{email_user_id, encode};
use super::kinds::Member;

/// Email (lower-cased) → platform user id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Directory {
    /// No directory: the user id is derived from the email.
    #[default]
    Derived,
    Map(HashMap<String, String>),
}

/// Why a member did not join.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    NoEmail,
    Bot,
    Deleted,
    Unknown,
    NotInDirectory,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("directory ConfigMap key is not a map of email to user id: {0}")]
pub struct DirectoryError(pub String);

impl Directory {
    /// Parse a directory document (YAML or JSON map of email → user id).
    pub fn parse(text: &str) -> Result<Self, DirectoryError> {
        let raw: HashMap<String, String> = serde_saphyr::from_str(text)
            .map_err(|e| DirectoryError(crate::scrub::scrub_bounded(&e.to_string(), 200)))?;
        Ok(Self::Map(
            raw.into_iter()
                .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_string()))
                .filter(|(k, v)| !k.is_empty() && !v.is_empty())
                .collect(),
        ))
    }
}

/// The SpiceDB `user` object id for `m`, or why there is none.
pub fn join(m: &Member, dir: &Directory) -> Result<String, Miss> {
    if m.unknown {
        return Err(Miss::Unknown);
    }
    if m.bot || m.id == "USLACKBOT" {
        return Err(Miss::Bot);
    }
    if m.deleted {
        return Err(Miss::Deleted);
    }
    let email = m
        .email
        .as_deref()
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .ok_or(Miss::NoEmail)?;
    match dir {
        Directory::Derived => Ok(email_user_id(email)),
        Directory::Map(map) => map
            .get(&email.to_lowercase())
            .map(|id| encode(id))
            .ok_or(Miss::NotInDirectory),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: &str, email: Option<&str>) -> Member {
        Member {
            id: id.into(),
            email: email.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn table() {
        let dir =
            Directory::parse("Ada@Example.com: u-ada\ngrace@example.com: \"u/grace\"\n").unwrap();
        let bot = Member {
            bot: true,
            ..m("B1", Some("bot@example.com"))
        };
        let deleted = Member {
            deleted: true,
            ..m("U9", Some("old@example.com"))
        };
        let unknown = Member {
            unknown: true,
            ..m("U8", None)
        };
        let cases: Vec<(Member, &Directory, Result<String, Miss>)> = vec![
            (
                m("U1", Some("Ada@Example.COM")),
                &Directory::Derived,
                Ok("ada+40example+2Ecom".into()),
            ),
            (m("U1", Some("ada@example.com")), &dir, Ok("u-ada".into())),
            (
                m("U2", Some("grace@example.com")),
                &dir,
                Ok("u+2Fgrace".into()),
            ),
            (
                m("U3", Some("linus@example.com")),
                &dir,
                Err(Miss::NotInDirectory),
            ),
            (m("U4", None), &Directory::Derived, Err(Miss::NoEmail)),
            (m("U5", Some("  ")), &Directory::Derived, Err(Miss::NoEmail)),
            (
                m("USLACKBOT", Some("slackbot@example.com")),
                &Directory::Derived,
                Err(Miss::Bot),
            ),
            (bot, &Directory::Derived, Err(Miss::Bot)),
            (deleted, &Directory::Derived, Err(Miss::Deleted)),
            (unknown, &Directory::Derived, Err(Miss::Unknown)),
        ];
        for (member, dir, want) in cases {
            assert_eq!(join(&member, dir), want, "{member:?}");
        }
    }

    #[test]
    fn directory_accepts_json_and_refuses_lists() {
        assert!(
            matches!(Directory::parse(r#"{"a@b.c": "u1"}"#), Ok(Directory::Map(m)) if m["a@b.c"] == "u1")
        );
        assert!(Directory::parse("- a\n- b\n").is_err());
    }
}
