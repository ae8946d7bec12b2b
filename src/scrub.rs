//! Error text scrubbing: nothing that reaches a status, an Event or a log may carry a URL query
//! string, a fragment or a bearer token, and no message may grow without bound.

/// Strip URL query strings and fragments, redact bearer tokens, and bound the length.
pub fn scrub(text: &str) -> String {
    bound(&strip_secrets(text), 512)
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

fn strip_secrets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = find_url(rest) {
        out.push_str(&redact_tokens(&rest[..pos]));
        let url_end = rest[pos..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | ')' | ']'))
            .map_or(rest.len(), |e| pos + e);
        let url = &rest[pos..url_end];
        let cut = url.find(['?', '#']).unwrap_or(url.len());
        out.push_str(&redact_path_tokens(&strip_userinfo(&url[..cut])));
        rest = &rest[url_end..];
    }
    out.push_str(&redact_tokens(rest));
    out
}

fn find_url(s: &str) -> Option<usize> {
    let lower = s.to_ascii_lowercase();
    [lower.find("http://"), lower.find("https://")]
        .into_iter()
        .flatten()
        .min()
}

/// A token can ride in a URL's path too (`https://hooks.example/xoxb-…/x`): redact any path
/// segment shaped like one.
fn redact_path_tokens(url: &str) -> String {
    url.split('/')
        .map(|seg| if is_tokenish(seg) { "[REDACTED]" } else { seg })
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

/// Redact the word after "Bearer"/"token=" and anything shaped like a Slack token.
fn redact_tokens(s: &str) -> String {
    let mut out = Vec::new();
    let mut redact_next = false;
    for word in s.split(' ') {
        let lw = word.to_ascii_lowercase();
        if redact_next && !word.is_empty() && lw != "bearer" && lw != "basic" {
            out.push("[REDACTED]".to_string());
            redact_next = false;
            continue;
        }
        if lw == "bearer" || lw == "basic" || lw.ends_with("authorization:") {
            redact_next = true;
            out.push(word.to_string());
        } else if is_tokenish(word) {
            out.push("[REDACTED]".to_string());
        } else if let Some(idx) = lw.find("token=").or_else(|| lw.find("key=")) {
            let eq = word[idx..].find('=').map_or(word.len(), |e| idx + e + 1);
            out.push(format!("{}[REDACTED]", &word[..eq]));
        } else {
            out.push(word.to_string());
        }
    }
    out.join(" ")
}

fn is_tokenish(word: &str) -> bool {
    let w = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '_');
    ["xoxb-", "xoxp-", "xoxa-", "xoxe-", "xapp-"]
        .iter()
        .any(|p| w.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
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
        ];
        for (input, want) in cases {
            assert_eq!(scrub(input), want, "input {input:?}");
        }
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
