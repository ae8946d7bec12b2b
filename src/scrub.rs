//! Error text scrubbing: nothing that reaches a status, an Event or a log may carry a URL query
//! string, a fragment, URL credentials, a bearer token, a credential-named field's value, a JWT,
//! or a secret kbind itself read (registered by value), and no message may grow without bound.

use std::sync::RwLock;

/// Secrets kbind read this run (kubeconfig tokens and keys, the SpiceDB key, upstream tokens),
/// redacted wherever they appear, whatever their shape.
static KNOWN: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Shortest value redacted by value: shorter strings would redact ordinary words.
const MIN_KNOWN: usize = 8;

const REDACTED: &str = "[REDACTED]";

/// Remember a secret value so every later scrub redacts it by value.
pub fn register_secret(value: &str) {
    let value = value.trim();
    if value.len() < MIN_KNOWN {
        return;
    }
    if let Ok(mut known) = KNOWN.write()
        && !known.iter().any(|k| k == value)
    {
        known.push(value.to_string());
    }
}

/// Strip URL query strings, fragments and credentials, redact tokens and credential-named
/// fields, and bound the length.
pub fn scrub(text: &str) -> String {
    bound(&strip_secrets(&redact_known(text)), 512)
}

/// [`scrub`] with another length bound (condition messages keep up to 1 KiB). Text cut short
/// anywhere is scrubbed with this, before the cut: a cut could split a token or a URL's
/// credentials so that the scrub no longer finds them.
pub fn scrub_bounded(text: &str, max: usize) -> String {
    bound(&strip_secrets(&redact_known(text)), max)
}

/// Truncate to at most `max` bytes on a char boundary, marking the cut.
pub fn bound(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

fn redact_known(text: &str) -> String {
    let Ok(known) = KNOWN.read() else {
        return text.to_string();
    };
    let mut out = text.to_string();
    for k in known.iter() {
        if out.contains(k.as_str()) {
            out = out.replace(k.as_str(), REDACTED);
        }
    }
    out
}

fn strip_secrets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some((pos, scheme_end)) = find_url(rest) {
        out.push_str(&redact_tokens(&rest[..pos]));
        let url_end = rest[scheme_end..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | ')' | ']'))
            .map_or(rest.len(), |e| scheme_end + e);
        let url = &rest[pos..url_end];
        let cut = url.find(['?', '#']).unwrap_or(url.len());
        out.push_str(&redact_path_tokens(&strip_userinfo(&url[..cut])));
        rest = &rest[url_end..];
    }
    out.push_str(&redact_tokens(rest));
    redact_fields(&out)
}

/// The first `scheme://` in `s` (any scheme: `postgres://u:p@h` carries credentials as well as
/// `https://`): (start of the scheme, end of `://`).
fn find_url(s: &str) -> Option<(usize, usize)> {
    let bytes = s.as_bytes();
    let mut from = 0;
    while let Some(i) = s[from..].find("://").map(|i| from + i) {
        let mut start = i;
        while start > 0
            && (bytes[start - 1].is_ascii_alphanumeric()
                || matches!(bytes[start - 1], b'+' | b'.' | b'-'))
        {
            start -= 1;
        }
        // A scheme starts with a letter; skip leading digits/punctuation.
        while start < i && !bytes[start].is_ascii_alphabetic() {
            start += 1;
        }
        if start < i {
            return Some((start, i + 3));
        }
        from = i + 3;
    }
    None
}

/// A token can ride in a URL's path too (`https://hooks.example/xoxb-…/x`): redact any path
/// segment shaped like one.
fn redact_path_tokens(url: &str) -> String {
    url.split('/')
        .map(|seg| if is_tokenish(seg) { REDACTED } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

/// `https://user:pass@host/x` → `https://host/x`.
fn strip_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let after = &url[scheme_end + 3..];
    let authority_end = after.find('/').unwrap_or(after.len());
    match after[..authority_end].rfind('@') {
        Some(at) => format!("{}{}", &url[..scheme_end + 3], &after[at + 1..]),
        None => url.to_string(),
    }
}

/// Field names whose value is a credential, in any of `k=v`, `k: v`, `"k":"v"`, `k="v"`.
const FIELDS: [&str; 9] = [
    "token",
    "secret",
    "password",
    "passwd",
    "apikey",
    "api_key",
    "api-key",
    "key",
    "credential",
];

/// Redact the value after a credential-named field (`access_token=…`, `"client_secret": "…"`,
/// `password: …`). The name must end the key (`token`, `access_token`, `x-api-key`), so
/// `tokens_used: 3` or `keyspace: a` stay.
fn redact_fields(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        // Bytes, not `str`: `i` steps through multi-byte characters too.
        let Some(name) = FIELDS
            .iter()
            .find(|f| lower.as_bytes()[i..].starts_with(f.as_bytes()))
        else {
            i += 1;
            continue;
        };
        let mut j = i + name.len();
        // The key must end here (optionally closed by a quote) ...
        if j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_') {
            i += 1;
            continue;
        }
        if j < bytes.len() && matches!(bytes[j], b'"' | b'\'') {
            j += 1;
        }
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        // ... and be followed by `=` or `:`.
        if j >= bytes.len() || !matches!(bytes[j], b'=' | b':') {
            i += 1;
            continue;
        }
        j += 1;
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        let quote = (j < bytes.len() && matches!(bytes[j], b'"' | b'\'')).then(|| bytes[j]);
        if quote.is_some() {
            j += 1;
        }
        let start = j;
        while j < bytes.len() {
            let b = bytes[j];
            let end = match quote {
                Some(q) => b == q,
                None => b.is_ascii_whitespace() || matches!(b, b',' | b'&' | b'}' | b';' | b'"'),
            };
            if end {
                break;
            }
            j += 1;
        }
        // `Authorization: Bearer x` and the like are handled word by word; a scheme word alone
        // is not the secret.
        if j > start && !matches!(&lower[start..j], "bearer" | "basic") {
            out.push_str(&text[copied..start]);
            out.push_str(REDACTED);
            copied = j;
        }
        i = j.max(i + 1);
    }
    out.push_str(&text[copied..]);
    out
}

/// Redact the word after "Bearer"/"Basic" (however it is quoted or glued to `Authorization:`)
/// and anything shaped like a Slack token or a JWT.
fn redact_tokens(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut redact_next = false;
    // Words end at any whitespace (a newline in a panic message or an upstream's body too);
    // each keeps the whitespace after it.
    for seg in s.split_inclusive(char::is_whitespace) {
        let word = seg.trim_end_matches(char::is_whitespace);
        let sep = &seg[word.len()..];
        // Quotes removed: `"Bearer`, `{"Authorization":"Bearer` and `Authorization:Bearer` alike.
        let norm: String = word
            .to_ascii_lowercase()
            .chars()
            .filter(|c| !matches!(c, '"' | '\''))
            .collect();
        let bare = norm.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != ':');
        if redact_next && !bare.is_empty() && bare != "bearer" && bare != "basic" {
            // Keep the punctuation around it (a closing quote or brace).
            let keep = word.len() - word.trim_end_matches(['"', '\'', '}', ',', ']']).len();
            out.push_str(&format!("{REDACTED}{}{sep}", &word[word.len() - keep..]));
            redact_next = false;
            continue;
        }
        // A value glued to its name (`error=Bearer x`, `error=xoxb-…`: a log field) counts too.
        if ["bearer", "basic"].iter().any(|k| {
            bare == *k || bare.ends_with(&format!(":{k}")) || bare.ends_with(&format!("={k}"))
        }) || bare.ends_with("authorization:")
        {
            redact_next = true;
            out.push_str(word);
        } else if is_tokenish(word) {
            out.push_str(REDACTED);
        } else if let Some((name, value)) = word.split_once('=')
            && is_tokenish(value)
        {
            out.push_str(&format!("{name}={REDACTED}"));
        } else {
            out.push_str(word);
        }
        out.push_str(sep);
    }
    out
}

fn is_tokenish(word: &str) -> bool {
    let w = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '_');
    [
        "xoxb-", "xoxp-", "xoxa-", "xoxe-", "xoxe.", "xapp-", "xoxs-",
    ]
    .iter()
    .any(|p| w.starts_with(p))
        || is_jwt(w)
}

/// `header.payload.signature`, base64url, the header starting `eyJ` (`{"`).
fn is_jwt(w: &str) -> bool {
    let parts: Vec<&str> = w.split('.').collect();
    parts.len() == 3
        && parts[0].starts_with("eyJ")
        && parts.iter().all(|p| {
            p.len() >= 8
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text that is not ASCII is scrubbed like any other, never a panic; a token glued to a
    /// field name (`error=…`, as a text log line prints a field) is found too.
    #[test]
    fn unicode_and_glued_values() {
        let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLXZhbHVl";
        let cases = [
            ("café token=x1y2z3 über", "café token=[REDACTED] über"),
            ("ééé https://h/ä?q=1 ü", "ééé https://h/ä ü"),
            ("error=xoxb-1-2 failed", "error=[REDACTED] failed"),
            (
                "error=Bearer abc123 failed",
                "error=Bearer [REDACTED] failed",
            ),
            (&format!("error={jwt}"), "error=[REDACTED]"),
            ("failed:\nxoxb-1-2\tnext", "failed:\n[REDACTED]\tnext"),
            ("a  double space", "a  double space"),
        ];
        for (input, want) in cases {
            assert_eq!(scrub(input), want, "{input}");
        }
    }

    #[test]
    fn table() {
        let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLXZhbHVl";
        let cases = [
            (
                "GET https://slack.com/api/users.list?cursor=abc&token=xoxb-1 failed",
                "GET https://slack.com/api/users.list failed",
            ),
            ("see http://h/x#frag.", "see http://h/x"),
            ("dial https://u:p@host:1/a?b", "dial https://host:1/a"),
            (
                "Authorization: Bearer abc.def",
                "Authorization: Bearer [REDACTED]",
            ),
            ("token xoxb-123-456 echoed", "token [REDACTED] echoed"),
            (
                "form access_token=secret here",
                "form access_token=[REDACTED] here",
            ),
            ("plain message", "plain message"),
            (
                "see https://slack.com/api/auth/xoxb-1-2/check?token=xoxb-1-2 now",
                "see https://slack.com/api/auth/[REDACTED]/check now",
            ),
            // Shapes the first scrubber missed (issue #11).
            (
                r#"{"Authorization":"Bearer abc123"}"#,
                r#"{"Authorization":"Bearer [REDACTED]"}"#,
            ),
            (
                "header \"Bearer abc123\" refused",
                "header \"Bearer [REDACTED]\" refused",
            ),
            (
                "Authorization:Bearer abc123 refused",
                "Authorization:Bearer [REDACTED] refused",
            ),
            (
                r#"{"access_token": "s3cr3t-value", "expires_in": 3600}"#,
                r#"{"access_token": "[REDACTED]", "expires_in": 3600}"#,
            ),
            (
                r#"{"client_secret":"abc","id":"x"}"#,
                r#"{"client_secret":"[REDACTED]","id":"x"}"#,
            ),
            (
                "password: hunter22 rejected",
                "password: [REDACTED] rejected",
            ),
            ("x-api-key=k-123&page=2", "x-api-key=[REDACTED]&page=2"),
            ("tokens_used: 3, keyspace: a", "tokens_used: 3, keyspace: a"),
            ("token xoxe.xoxp-1-abc echoed", "token [REDACTED] echoed"),
            (
                "dial postgres://admin:pw@db:5432/x failed",
                "dial postgres://db:5432/x failed",
            ),
            ("amqp://guest:guest@mq/vhost?heartbeat=5", "amqp://mq/vhost"),
        ];
        for (input, want) in cases {
            assert_eq!(scrub(input), want, "input {input:?}");
        }
        let got = scrub(&format!("token was {jwt}."));
        assert!(!got.contains("eyJ"), "{got}");
    }

    #[test]
    fn registered_secrets_are_redacted_by_value() {
        register_secret("k8s-token-0123456789");
        register_secret("short");
        let got = scrub("401 for k8s-token-0123456789 (k8s-token-0123456789)");
        assert!(!got.contains("0123456789"), "{got}");
        assert_eq!(scrub("short words stay"), "short words stay");
    }

    #[test]
    fn bound_respects_char_boundaries() {
        let s = "é".repeat(600);
        let b = bound(&s, 101);
        assert!(b.len() <= 101, "{}", b.len());
        assert!(b.ends_with("..."));
        assert_eq!(bound("short", 10), "short");
    }
}
