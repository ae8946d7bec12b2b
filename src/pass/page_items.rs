//! Counting a LIST page's items before it is decoded. A page decodes to far more memory than its
//! bytes when it holds many tiny items (2 MiB of `{},{},...` is 700,000 objects), so a page with
//! more items than the request asked for is refused from its bytes alone: the count needs no
//! allocation and stops at the first item past the limit (docs/hostile-inputs.md).

/// Whether the top-level `items` array of the JSON document `body` holds more than `limit`
/// elements. A body that is not a JSON object with such an array holds none.
pub fn more_than(body: &[u8], limit: usize) -> bool {
    let Some(start) = items_array(body) else {
        return false;
    };
    let mut depth = 0usize;
    let mut count = 0usize;
    let mut in_item = false;
    let mut i = start;
    while i < body.len() {
        match body[i] {
            b'"' => {
                i = skip_string(body, i);
                if depth == 0 && !in_item {
                    in_item = true;
                    count += 1;
                }
                continue;
            }
            b'[' | b'{' => {
                if depth == 0 && !in_item {
                    in_item = true;
                    count += 1;
                }
                depth += 1;
            }
            b']' | b'}' if depth == 0 => return false,
            b']' | b'}' => depth -= 1,
            b',' if depth == 0 => in_item = false,
            c if depth == 0 && !in_item && !c.is_ascii_whitespace() => {
                in_item = true;
                count += 1;
            }
            _ => {}
        }
        if count > limit {
            return true;
        }
        i += 1;
    }
    false
}

/// The index just after the `[` of the top-level `"items"` array, if there is one.
fn items_array(body: &[u8]) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = 0;
    let mut key: Option<(usize, usize)> = None;
    while i < body.len() {
        match body[i] {
            b'"' => {
                let end = skip_string(body, i);
                if depth == 1 {
                    key = Some((i + 1, end.saturating_sub(1)));
                }
                i = end;
                continue;
            }
            b'[' if depth == 1 => {
                if key.is_some_and(|(s, e)| body.get(s..e) == Some(b"items")) {
                    return Some(i + 1);
                }
                depth += 1;
            }
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth = depth.checked_sub(1)?,
            b',' if depth == 1 => key = None,
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index just after the string starting at `body[start] == b'"'`.
fn skip_string(body: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < body.len() {
        match body[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    body.len()
}

#[cfg(test)]
mod tests {
    use super::more_than;

    #[test]
    fn counts_the_top_level_items_only() {
        let page = br#"{"kind":"List","metadata":{"continue":"x","items":[1,2,3,4]},
            "items":[{"metadata":{"name":"a","items":[1,2,3]}},{"s":"],[{\"}"},[],"x",7]}"#;
        assert!(!more_than(page, 5), "five items");
        assert!(more_than(page, 4));
        assert!(!more_than(br#"{"items":[]}"#, 0));
        assert!(more_than(br#"{"items":[{}]}"#, 0));
        assert!(!more_than(br#"{"items": [ {} , {} ] }"#, 2));
        assert!(more_than(br#"{"items": [ {} , {} ] }"#, 1));
        // Not a list: nothing to count.
        assert!(!more_than(br#"{"kind":"Status","message":"items"}"#, 0));
        assert!(!more_than(b"not json", 0));
        assert!(!more_than(br#"["items",[1,2]]"#, 0));
    }

    #[test]
    fn stops_at_the_first_item_past_the_limit() {
        let mut page = br#"{"items":["#.to_vec();
        for _ in 0..700_000 {
            page.extend_from_slice(b"{},");
        }
        page.extend_from_slice(b"{}]}");
        assert!(more_than(&page, 500));
        assert!(!more_than(&page, 700_001));
    }
}
