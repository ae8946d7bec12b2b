//! Reversible encoding of arbitrary text (upstream ids, emails, namespace and name) into
//! SpiceDB's object-id alphabet `[a-zA-Z0-9/_|\-=+]`. Letters, digits, `_` and `-` pass through;
//! every other byte becomes `+XX` (upper-case hex). `/` is never produced, so kbind can use it as
//! a separator inside object ids (`<namespace>/<name>/<upstream id>`), and decoding is exact.

/// Encode `s` into SpiceDB's object-id alphabet, without `/`.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("+{b:02X}"));
        }
    }
    out
}

/// Invert [`encode`]; `None` when `s` is not an encoding kbind produced.
pub fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                if hex.bytes().any(|c| c.is_ascii_lowercase()) {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// The platform user id of an email when no directory maps it: the encoded, lower-cased email.
pub fn email_user_id(email: &str) -> String {
    encode(&email.trim().to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid_object_id(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 1024
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/_|-=+".contains(&b))
    }

    #[test]
    fn table() {
        let cases = [
            ("C024BE91L", "C024BE91L"),
            ("ada@example.com", "ada+40example+2Ecom"),
            ("team-a", "team-a"),
            ("a/b", "a+2Fb"),
            ("a+b", "a+2Bb"),
            ("é", "+C3+A9"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(encode(input), want, "{input:?}");
            assert_eq!(decode(want).as_deref(), Some(input), "{want:?}");
        }
    }

    #[test]
    fn round_trips_and_stays_in_the_alphabet_without_slash() {
        let samples = [
            "USLACKBOT",
            "Grace.Hopper+tag@Example.COM",
            "weird id with spaces/and|pipes=+",
            "日本語",
            "%41",
            "..",
        ];
        for s in samples {
            let e = encode(s);
            assert!(valid_object_id(&e) || s.is_empty(), "{e}");
            assert!(!e.contains('/'), "{e}");
            assert_eq!(decode(&e).as_deref(), Some(s));
        }
    }

    #[test]
    fn distinct_inputs_never_collide() {
        // Pass-through characters and escapes cannot be confused: `+` itself is escaped.
        assert_ne!(encode("+41"), encode("A"));
        assert_ne!(encode("a.b"), encode("a+2Eb"));
    }

    #[test]
    fn decode_refuses_what_encode_never_produces() {
        for bad in ["a.b", "+4", "+zz", "+2e", "a/b", "a@b"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn email_ids_are_case_insensitive() {
        assert_eq!(
            email_user_id(" Ada@Example.com "),
            email_user_id("ada@example.com")
        );
    }
}
