use super::*;
use k8s_openapi::ByteString;
use std::collections::BTreeMap;

fn secret(key: &str, value: &str) -> Secret {
    Secret {
        data: Some(BTreeMap::from([(
            key.to_string(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

fn kubeconfig(cluster_extra: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: p\n  cluster:\n    server: https://127.0.0.1:6443\n{cluster_extra}contexts:\n- name: c\n  context:\n    cluster: p\n    user: u\n    namespace: tenant\nusers:\n- name: u\n  user:\n{user}"
    )
}

#[test]
fn table() {
    let ok_user = "    token: abc\n";
    let cases: Vec<(&str, Option<Secret>, Result<&str, &str>)> = vec![
        ("missing secret", None, Err("SecretNotFound")),
        ("wrong key", Some(secret("config", "x")), Err("KeyNotFound")),
        (
            "not yaml",
            Some(secret("kubeconfig", "::: [")),
            Err("InvalidKubeconfig"),
        ),
        (
            "binary",
            Some(Secret {
                data: Some(BTreeMap::from([(
                    "kubeconfig".into(),
                    ByteString(vec![0xff, 0xfe, 0]),
                )])),
                ..Default::default()
            }),
            Err("InvalidKubeconfig"),
        ),
        (
            "huge",
            Some(secret("kubeconfig", &"a".repeat(300_000))),
            Err("InvalidKubeconfig"),
        ),
        (
            "exec",
            Some(secret(
                "kubeconfig",
                &kubeconfig(
                    "",
                    "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: gcloud\n",
                ),
            )),
            Err("user.exec"),
        ),
        (
            "ca path",
            Some(secret(
                "kubeconfig",
                &kubeconfig("    certificate-authority: /etc/ca.crt\n", ok_user),
            )),
            Err("certificate-authority is a file path"),
        ),
        (
            "cert path",
            Some(secret(
                "kubeconfig",
                &kubeconfig("", "    client-certificate: /home/me/.kube/c.crt\n"),
            )),
            Err("client-certificate is a file path"),
        ),
        (
            "token file",
            Some(secret(
                "kubeconfig",
                &kubeconfig("", "    tokenFile: /var/run/token\n"),
            )),
            Err("tokenFile"),
        ),
        (
            "ok",
            Some(secret("kubeconfig", &kubeconfig("", ok_user))),
            Ok("tenant"),
        ),
    ];
    for (what, s, want) in cases {
        let got = kubeconfig_from_secret(
            s.as_ref(),
            "ns",
            "name",
            "kubeconfig",
            &CredentialPolicy::default(),
        );
        match (got, want) {
            (Ok(pk), Ok(ns)) => assert_eq!(pk.default_namespace, ns, "{what}"),
            (Err(e), Err(needle)) => assert!(
                e.reason() == needle || e.to_string().contains(needle),
                "{what}: {e} lacks {needle}"
            ),
            (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
        }
    }
}

/// The error for Secret ns/n whose key `kubeconfig` holds `value`.
/// The kubeconfig `text` under key `kubeconfig`, validated with the default policy.
fn checked(text: &str) -> ProviderKubeconfig {
    kubeconfig_from_secret(
        Some(&secret("kubeconfig", text)),
        "ns",
        "n",
        "kubeconfig",
        &CredentialPolicy::default(),
    )
    .unwrap()
}

fn refused(value: &str) -> CredentialError {
    let s = secret("kubeconfig", value);
    kubeconfig_from_secret(
        Some(&s),
        "ns",
        "n",
        "kubeconfig",
        &CredentialPolicy::default(),
    )
    .unwrap_err()
}

#[test]
fn errors_never_quote_the_secret() {
    let e = refused("token: xoxb-secret-value\n  bad: [indent");
    assert!(!e.to_string().contains("secret-value"), "{e}");
}

/// A key that holds something other than a kubeconfig (a bare token, a number, a list, a field
/// of the wrong type) is refused without a byte of it in the message.
#[test]
fn a_key_holding_no_kubeconfig_is_refused_without_quoting_it() {
    for (value, secret_part) in [
        ("ghp_bareTokenValue0123456789", "bareTokenValue"),
        ("'single-quoted-secret-value'", "quoted-secret"),
        ("\"double-quoted-secret-value\"", "quoted-secret"),
        (
            "- listed-secret-value\n- another-secret-value",
            "secret-value",
        ),
        ("clusters: cluster-secret-value", "cluster-secret"),
        (
            "apiVersion: v1\nkind: Config\nusers: 123456789012345",
            "123456789012345",
        ),
        ("current-context: [ctx-secret-value", "ctx-secret"),
        ("`backtick-secret-value`", "backtick-secret"),
    ] {
        let shown = refused(value).to_string();
        assert!(!shown.contains(secret_part), "{value:?} echoed: {shown}");
        assert!(shown.contains("ns/n"), "names the Secret: {shown}");
    }
}

#[test]
fn scrubbed_parser_messages_keep_what_went_wrong() {
    assert_eq!(
        scrub_yaml_error(
            "invalid type: string \"tok\", expected struct Kubeconfig at line 1 column 1"
        ),
        "invalid type: string (value not shown), expected struct Kubeconfig"
    );
    assert_eq!(
        scrub_yaml_error("unknown variant `abc`, expected one of"),
        "unknown variant (value not shown), expected one of"
    );
    assert_eq!(
        scrub_yaml_error("unterminated \"abc"),
        "unterminated (value not shown)"
    );
}

#[test]
fn widening_fields_are_refused_unless_re_allowed() {
    let ok_user = "    token: abc\n";
    let https = kubeconfig("", ok_user);
    let cases: Vec<(&str, String, KubeconfigField)> = vec![
        (
            "proxy-url",
            kubeconfig("    proxy-url: http://proxy.example:3128\n", ok_user),
            KubeconfigField::ProxyUrl,
        ),
        (
            "insecure-skip-tls-verify",
            kubeconfig("    insecure-skip-tls-verify: true\n", ok_user),
            KubeconfigField::InsecureSkipTlsVerify,
        ),
        (
            "http",
            https.replace("https://127.0.0.1:6443", "http://127.0.0.1:6443"),
            KubeconfigField::Http,
        ),
        (
            "impersonation",
            kubeconfig("", "    token: abc\n    as: system:admin\n"),
            KubeconfigField::Impersonation,
        ),
        (
            "impersonated groups",
            kubeconfig("", "    token: abc\n    as-groups: [system:masters]\n"),
            KubeconfigField::Impersonation,
        ),
    ];
    for (what, kc, field) in cases {
        let s = secret("kubeconfig", &kc);
        let refused = kubeconfig_from_secret(
            Some(&s),
            "ns",
            "n",
            "kubeconfig",
            &CredentialPolicy::default(),
        )
        .unwrap_err();
        assert_eq!(refused.reason(), "KubeconfigFieldNotAllowed", "{what}");
        assert!(
            refused
                .to_string()
                .contains(what.split(' ').next_back().unwrap_or(what))
                || refused.to_string().contains("impersonation"),
            "{what}: {refused}"
        );
        let args = CredentialArgs {
            allow_kubeconfig_fields: vec![field],
            ..Default::default()
        };
        let policy = CredentialPolicy::new(&args, "ns".into());
        assert!(
            kubeconfig_from_secret(Some(&s), "ns", "n", "kubeconfig", &policy).is_ok(),
            "{what} re-allowed"
        );
    }
    let plain = secret("kubeconfig", &https);
    assert!(
        kubeconfig_from_secret(
            Some(&plain),
            "ns",
            "n",
            "kubeconfig",
            &CredentialPolicy::default()
        )
        .is_ok()
    );
}

#[tokio::test]
async fn a_metadata_server_is_refused_before_any_request() {
    let kc = kubeconfig("", "    token: abc\n")
        .replace("https://127.0.0.1:6443", "https://169.254.169.254");
    let pk = checked(&kc);
    let e = check_server_address(&pk).await.unwrap_err();
    assert_eq!(e.reason(), "KubeconfigFieldNotAllowed");
    assert!(e.to_string().contains("169.254.169.254"), "{e}");
    let kc = kubeconfig("", "    token: abc\n")
        .replace("https://127.0.0.1:6443", "https://[fe80::1]:6443");
    let pk = checked(&kc);
    assert!(check_server_address(&pk).await.is_err());
    let ok = checked(&kubeconfig("", "    token: abc\n"));
    assert!(check_server_address(&ok).await.is_ok());
}

#[test]
fn credential_namespaces() {
    let p = CredentialPolicy::new(&CredentialArgs::default(), "kbind-system".into());
    assert!(p.check_namespace("kbind-system", "s").is_ok());
    let e = p.check_namespace("kube-system", "admin").unwrap_err();
    assert_eq!(e.reason(), "SecretNamespaceNotAllowed");
    let args = CredentialArgs {
        credential_namespaces: vec!["a".into(), "b".into()],
        ..Default::default()
    };
    let p = CredentialPolicy::new(&args, "kbind-system".into());
    assert!(p.check_namespace("b", "s").is_ok());
    assert!(
        p.check_namespace("kbind-system", "s").is_err(),
        "the flag replaces the default"
    );
    // The refusal says exactly what to set, for each way of installing kbind.
    let m = p
        .check_namespace("kbind", "provider")
        .unwrap_err()
        .to_string();
    for what in [
        "--credential-namespace=a,b,kbind",
        "credentialNamespaces: [kbind]",
        "kbind-schema-credentials",
        "kbind-resync-credentials",
        "or move the Secret into a,b",
    ] {
        assert!(m.contains(what), "{what} in: {m}");
    }
}

/// Only a kubeconfig whose current context carries the `iam.kbind.io/grant` extension names a
/// Grant Secret; a malformed one is an error, never a guess.
#[test]
fn issued_grant_secret_reads_only_the_current_contexts_extension() {
    let with = |ext: &str| {
        kubeconfig("", "    token: abc\n").replace(
            "    namespace: tenant\n",
            &format!("    namespace: tenant\n    extensions:\n    - name: iam.kbind.io/grant\n      extension: {ext}\n"),
        )
    };
    let kc = |text: String| Kubeconfig::from_yaml(&text).unwrap();
    assert_eq!(
        issued_grant_secret(&kc(kubeconfig("", "    token: abc\n"))),
        Ok(None)
    );
    assert_eq!(
        issued_grant_secret(&kc(with("{grant: g, secret: kbind-grants/kbind-grant-g}"))),
        Ok(Some(("kbind-grants".into(), "kbind-grant-g".into())))
    );
    for bad in [
        "{grant: g}",
        "{secret: no-slash}",
        "{secret: 'A/B'}",
        "{secret: 7}",
    ] {
        let e = issued_grant_secret(&kc(with(bad))).unwrap_err();
        assert!(e.contains("iam.kbind.io/grant"), "{bad}: {e}");
    }
}

/// Rotation by pull accepts a new token for the same endpoint only: each other change is named.
#[test]
fn endpoint_changes_are_named() {
    let kc = |text: String| Kubeconfig::from_yaml(&text).unwrap();
    let base = kubeconfig("", "    token: first-token\n");
    let current = kc(base.clone());
    assert_eq!(
        endpoint_change(&current, &kc(kubeconfig("", "    token: second-token\n"))),
        None,
        "a new token is a rotation"
    );
    for (next, what) in [
        (
            base.replace("https://127.0.0.1:6443", "https://localhost:6443"),
            "server",
        ),
        (
            kubeconfig(
                "    certificate-authority-data: Zm9v\n",
                "    token: first-token\n",
            ),
            "certificate authority",
        ),
        (
            kubeconfig(
                "    tls-server-name: other.example\n",
                "    token: first-token\n",
            ),
            "TLS server name",
        ),
        (
            kubeconfig(
                "",
                "    client-certificate-data: Zm9v\n    client-key-data: YmFy\n",
            ),
            "authentication method",
        ),
        (
            kubeconfig(
                "    proxy-url: http://127.0.0.9:3128\n",
                "    token: first-token\n",
            ),
            "proxy",
        ),
        (
            kubeconfig("", "    token: first-token\n    as: system:admin\n"),
            "impersonation",
        ),
        (
            kubeconfig("", "    token: first-token\n    as-uid: \"0\"\n"),
            "impersonation",
        ),
        (
            kubeconfig(
                "    insecure-skip-tls-verify: true\n",
                "    token: first-token\n",
            ),
            "TLS verification",
        ),
    ] {
        assert_eq!(endpoint_change(&current, &kc(next)), Some(what));
    }
}

/// A server named by host is reached at the address it was checked at (no second lookup):
/// the URL carries the address, TLS verifies and SNI names the host, requests carry it as
/// Host. An address, or a proxy (which resolves for itself), is left alone.
#[tokio::test]
async fn a_named_server_is_reached_at_the_address_it_was_checked_at() {
    let named = kubeconfig("", "    token: abc\n")
        .replace("https://127.0.0.1:6443", "https://localhost:6443");
    let pk = checked(&named);
    let ip = check_server_address(&pk).await.unwrap();
    assert!(ip.is_some_and(|ip| ip.is_loopback()), "{ip:?}");
    let literal = checked(&kubeconfig("", "    token: abc\n"));
    assert_eq!(check_server_address(&literal).await.unwrap(), None);

    let at = |url: &str| {
        let mut c = Config::new(url.parse().unwrap());
        pin_to(&mut c, "192.0.2.7".parse().unwrap());
        c
    };
    let c = at("https://provider.example:6443/prefix");
    assert_eq!(c.cluster_url.to_string(), "https://192.0.2.7:6443/prefix");
    assert_eq!(c.tls_server_name.as_deref(), Some("provider.example"));
    assert_eq!(
        c.headers,
        vec![(
            http::header::HOST,
            http::HeaderValue::from_static("provider.example:6443")
        )]
    );
    let c = at("https://provider.example");
    assert_eq!(c.cluster_url.to_string(), "https://192.0.2.7:443/");
    assert_eq!(c.headers[0].1, "provider.example");
    let mut v6 = Config::new("https://provider.example:6443".parse().unwrap());
    pin_to(&mut v6, "2001:db8::1".parse().unwrap());
    assert_eq!(v6.cluster_url.to_string(), "https://[2001:db8::1]:6443/");
    // A tls-server-name the kubeconfig set is kept.
    let mut named_tls = Config::new("https://provider.example:6443".parse().unwrap());
    named_tls.tls_server_name = Some("apiserver.internal".into());
    pin_to(&mut named_tls, "192.0.2.7".parse().unwrap());
    assert_eq!(
        named_tls.tls_server_name.as_deref(),
        Some("apiserver.internal")
    );
    for unchanged in ["https://10.0.0.1:6443/", "https://[2001:db8::2]:6443/"] {
        assert_eq!(at(unchanged).cluster_url.to_string(), unchanged);
        assert!(at(unchanged).tls_server_name.is_none());
    }
    let mut proxied = Config::new("https://provider.example:6443".parse().unwrap());
    proxied.proxy_url = Some("http://proxy.example:3128".parse().unwrap());
    pin_to(&mut proxied, "192.0.2.7".parse().unwrap());
    assert_eq!(
        proxied.cluster_url.to_string(),
        "https://provider.example:6443/"
    );
}
