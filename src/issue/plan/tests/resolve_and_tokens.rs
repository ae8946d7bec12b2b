use super::*;

#[test]
fn resolve_reports_each_way_a_grant_can_fail() {
    let c = catalog();
    let cases: [(GrantSpec, Result<Vec<&str>, &str>); 5] = [
        (spec(Some("widgets"), None), Ok(vec!["widgets.example.org"])),
        // A Collection: every Export's APIs, deduplicated and sorted.
        (
            spec(None, Some("all")),
            Ok(vec!["gadgets.example.org", "widgets.example.org"]),
        ),
        (spec(Some("nope"), None), Err(EXPORT_NOT_FOUND)),
        (spec(None, Some("nope")), Err(COLLECTION_NOT_FOUND)),
        (spec(Some("broken"), None), Err(API_NOT_EXPORTED)),
    ];
    for (s, want) in cases {
        let got = resolve(&s, &c)
            .map(|r| r.apis.iter().map(|a| a.name.clone()).collect::<Vec<_>>())
            .map_err(|b| b.reason);
        let want = want.map(|v| v.into_iter().map(String::from).collect::<Vec<_>>());
        assert_eq!(got, want, "{s:?}");
    }
    // Permissions shared by two Exports of a Collection are granted once.
    assert_eq!(
        resolve(&spec(None, Some("all")), &c)
            .unwrap()
            .permissions
            .len(),
        1
    );
    let broken = resolve(&spec(Some("broken"), None), &c).unwrap_err();
    assert!(broken.message.contains("nothere.example.org"), "{broken:?}");
}

#[test]
fn token_ttl_is_clamped_and_bad_text_blocks() {
    let mut s = spec(Some("widgets"), None);
    for (ttl, want) in [
        ("24h", Ok(Duration::from_secs(86400))),
        ("1m", Ok(MIN_TTL)),
        ("400h", Ok(MAX_TTL)),
        ("7d", Err(INVALID_TOKEN_TTL)),
    ] {
        s.token_ttl = ttl.into();
        assert_eq!(token_ttl(&s).map_err(|b| b.reason), want, "{ttl}");
    }
}

#[test]
fn token_is_reissued_only_when_needed() {
    let day = Duration::from_secs(86400);
    let c = cfg(1_000_000);
    let fresh = issued_with_secret(&c, "tok", 1_000_000 + 86400);
    assert_eq!(
        token(&fresh, "g", day, &c),
        Token::Keep {
            expires_at: t(1_000_000 + 86400)
        }
    );
    // A third of the TTL is the default margin: 8h01m left keeps, 7h59m re-issues.
    let keep = issued_with_secret(&c, "tok", 1_000_000 + 8 * 3600 + 60);
    assert!(matches!(token(&keep, "g", day, &c), Token::Keep { .. }));
    let near = issued_with_secret(&c, "tok", 1_000_000 + 8 * 3600 - 60);
    assert!(matches!(token(&near, "g", day, &c), Token::Issue { .. }));
    // --reissue-before as long as the TTL: every run re-issues.
    let mut always = cfg(1_000_000);
    always.reissue_before = Some(day);
    assert!(matches!(
        token(&fresh, "g", day, &always),
        Token::Issue { .. }
    ));
    // Expired.
    let gone = issued_with_secret(&c, "tok", 999_000);
    assert!(matches!(token(&gone, "g", day, &c), Token::Issue { .. }));

    let mut cases: Vec<(&str, Issued)> = Vec::new();
    cases.push(("no Secret", Issued::default()));
    let mut recreated = fresh.clone();
    recreated.sa_uid = Some("sa-2".into());
    cases.push(("ServiceAccount re-created", recreated));
    let mut no_sa = fresh.clone();
    no_sa.sa_uid = None;
    cases.push(("ServiceAccount missing", no_sa));
    let mut no_token = fresh.clone();
    no_token.secret.as_mut().unwrap().token = None;
    cases.push(("no token", no_token));
    for (what, issued) in cases {
        assert!(
            matches!(token(&issued, "g", day, &c), Token::Issue { .. }),
            "{what}"
        );
    }
    // Another server URL: the kubeconfig no longer matches.
    let mut moved = cfg(1_000_000);
    moved.server = "https://elsewhere.example".into();
    assert!(matches!(
        token(&fresh, "g", day, &moved),
        Token::Issue { .. }
    ));
}
