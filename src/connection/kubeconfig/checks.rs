//! The checks a Connection kubeconfig passes before any client is built from it (docs/schema.md "Credentials: where they may live, what they may say").

use super::*;

/// Fields that widen the credential's reach, each refused unless re-allowed.
pub(super) fn check_fields(
    kc: &Kubeconfig,
    allowed: &BTreeSet<KubeconfigField>,
) -> Result<(), String> {
    let (cluster, user) = current(kc);
    let refused = |f: KubeconfigField| !allowed.contains(&f);
    if let Some(c) = cluster {
        if c.proxy_url.is_some() && refused(KubeconfigField::ProxyUrl) {
            return Err("cluster.proxy-url would send the credential through a proxy; refused (--allow-kubeconfig-field proxy-url re-allows it)".into());
        }
        if c.insecure_skip_tls_verify == Some(true)
            && refused(KubeconfigField::InsecureSkipTlsVerify)
        {
            return Err("cluster.insecure-skip-tls-verify turns off the provider's certificate check; refused (--allow-kubeconfig-field insecure-skip-tls-verify re-allows it)".into());
        }
        if c.server
            .as_deref()
            .is_some_and(|s| s.starts_with("http://"))
            && refused(KubeconfigField::Http)
        {
            return Err("cluster.server is http://: the credential would travel in clear text; refused (--allow-kubeconfig-field http re-allows it)".into());
        }
    }
    if let Some(u) = user {
        let impersonates = u.impersonate.is_some()
            || u.impersonate_uid.is_some()
            || u.impersonate_groups.as_ref().is_some_and(|g| !g.is_empty())
            || u.impersonate_user_extra
                .as_ref()
                .is_some_and(|e| !e.is_empty());
        if impersonates && refused(KubeconfigField::Impersonation) {
            return Err("user.as/as-groups/as-uid/as-user-extra (impersonation) would act as another identity; refused (--allow-kubeconfig-field impersonation re-allows it)".into());
        }
    }
    Ok(())
}

/// The parser's message without any of the document in it: its first line (what went wrong),
/// cut before the location, with every quoted value (`"..."`, `'...'`, `` `...` ``) replaced.
/// A Secret key that holds a bare token rather than a kubeconfig would otherwise come back as
/// `invalid type: string "<the token>"` (docs/hostile-inputs.md).
pub(super) fn scrub_yaml_error(msg: &str) -> String {
    let first = msg.lines().next().unwrap_or("parse error");
    let first = first.split(" at line").next().unwrap_or(first);
    let mut out = String::with_capacity(first.len());
    let mut open: Option<char> = None;
    for ch in first.chars() {
        match open {
            Some(q) if ch == q => {
                out.push_str("(value not shown)");
                open = None;
            }
            Some(_) => {}
            None if matches!(ch, '"' | '\'' | '`') => open = Some(ch),
            None => out.push(ch),
        }
    }
    if open.is_some() {
        out.push_str("(value not shown)");
    }
    scrub(&out)
}

/// Checks the current context's cluster and user; returns the context namespace.
pub(super) fn check_self_contained(kc: &Kubeconfig) -> Result<String, String> {
    let ctx_name = kc
        .current_context
        .clone()
        .or_else(|| (kc.contexts.len() == 1).then(|| kc.contexts[0].name.clone()))
        .ok_or("no current-context")?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| format!("current-context {ctx_name:?} is not defined"))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| format!("cluster {:?} is not defined", ctx.cluster))?;
    match cluster.server.as_deref() {
        Some(s) if s.starts_with("https://") || s.starts_with("http://") => {}
        Some(_) => return Err("cluster.server is not an http(s) URL".into()),
        None => return Err("cluster.server is missing".into()),
    }
    if cluster.certificate_authority.is_some() {
        return Err(
            "cluster.certificate-authority is a file path; embed certificate-authority-data".into(),
        );
    }
    if let Some(user) = &ctx.user {
        let auth = kc
            .auth_infos
            .iter()
            .find(|a| &a.name == user)
            .and_then(|a| a.auth_info.as_ref())
            .ok_or_else(|| format!("user {user:?} is not defined"))?;
        let fields = [
            (auth.exec.is_some(), "user.exec runs a credential plugin"),
            (
                auth.auth_provider.is_some(),
                "user.auth-provider needs an interactive login",
            ),
            (
                auth.token_file.is_some(),
                "user.tokenFile is a file path; embed token",
            ),
            (
                auth.client_certificate.is_some(),
                "user.client-certificate is a file path; embed client-certificate-data",
            ),
            (
                auth.client_key.is_some(),
                "user.client-key is a file path; embed client-key-data",
            ),
        ];
        if let Some((_, what)) = fields.iter().find(|(bad, _)| *bad) {
            return Err((*what).to_string());
        }
    }
    Ok(ctx
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into()))
}
