//! autoBind, pure: the ClusterBinding named after a Connection listing every API it exports
//! (applied, left, or deleted after two empty discoveries, never while its CRDs hold objects),
//! and the Connection's `AutoBind` condition saying why when it cannot be kept.

use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::api::core::MAX_BINDING_APIS;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AutoBind {
    Leave,
    /// Apply the ClusterBinding named after the Connection with these APIs.
    Apply(Vec<String>),
    Delete,
}

/// What autoBind has to work with: off, its ClusterBinding (absent or owned by the Connection),
/// or that name held by a binding the Connection does not own.
#[derive(Clone, Copy, Debug)]
pub enum AutoBindView<'a> {
    Off,
    Maintained(Option<&'a BindingView>),
    NameTaken,
}

/// autoBind's reserved name held by someone else is the user's to resolve: say so where they
/// look (a log line in a CronJob's pod is seen by nobody).
pub(super) fn autobind_condition(
    o: &Observed,
    st: &mut ConnectionStatus,
    autobind: AutoBindView<'_>,
    now: Timestamp,
) {
    let g = o.generation;
    match autobind {
        AutoBindView::NameTaken => st.conditions.set_condition(
            AUTO_BIND,
            S::False,
            "NameTaken",
            &format!(
                "ClusterBinding {} exists and is not owned by this Connection; autoBind leaves it alone. Delete or rename it to let autoBind maintain it",
                o.name
            ),
            g,
            now,
        ),
        AutoBindView::Maintained(_)
            if o
                .exports()
                .is_some_and(|d| d.exports.len() > MAX_BINDING_APIS) =>
        {
            st.conditions.set_condition(
                AUTO_BIND,
                S::False,
                TOO_MANY_APIS,
                &too_many_message(o),
                g,
                now,
            )
        }
        // Not discovered this run: what the last discovery found still stands.
        AutoBindView::Maintained(_)
            if o.exports().is_none()
                && st
                    .conditions
                    .iter()
                    .any(|c| c.type_ == AUTO_BIND && c.reason == TOO_MANY_APIS) =>
        {
            false
        }
        AutoBindView::Maintained(Some(_))
            if o.exports().is_some_and(|d| d.exports.is_empty()) && !o.holding.is_empty() =>
        {
            st.conditions.set_condition(
                AUTO_BIND,
                S::False,
                EXPORTS_WITHDRAWN,
                &withdrawn_message(o),
                g,
                now,
            )
        }
        AutoBindView::Maintained(_) => {
            st.conditions
                .set_condition(AUTO_BIND, S::True, "Maintained", "", g, now)
        }
        AutoBindView::Off => st.conditions.remove_condition(AUTO_BIND),
    };
}

/// The reason of `AutoBind=False` while the provider exports more APIs than one binding lists.
pub const TOO_MANY_APIS: &str = "TooManyAPIs";

fn too_many_message(o: &Observed) -> String {
    let n = o.exports().map_or(0, |d| d.exports.len());
    format!(
        "the provider exports {n} APIs and a ClusterBinding lists at most {MAX_BINDING_APIS}, so autoBind cannot keep ClusterBinding {} listing them all: it is left as it is (or not created). Turn autoBind off and bind the APIs in ClusterBindings of at most {MAX_BINDING_APIS} each, or export fewer",
        o.name
    )
}

/// The reason of `AutoBind=False` while the provider exports nothing and consumer CRDs of the
/// autoBind ClusterBinding hold objects; [`exports_withdrawn`] reads it back for the Event.
pub const EXPORTS_WITHDRAWN: &str = "ExportsWithdrawn";

fn withdrawn_message(o: &Observed) -> String {
    let why: Vec<String> = o
        .holding
        .iter()
        .map(|(crd, h)| match h {
            Holding::Objects => format!("{crd} (holds objects)"),
            Holding::Unreadable(e) => format!("{crd} (objects not listed: {e})"),
        })
        .collect();
    format!(
        "the provider exports nothing any more; ClusterBinding {} stays while these consumer CRDs may hold objects: {}. Once they are empty (kbind schema needs list on their objects to see it), autoBind removes the binding; a CRD still holding objects is never deleted by it",
        o.name,
        why.join(", ")
    )
}

/// The message of an `ExportsWithdrawn` AutoBind condition in `st`, if it carries one.
pub fn exports_withdrawn(st: &ConnectionStatus) -> Option<&str> {
    st.conditions
        .iter()
        .find(|c| c.type_ == AUTO_BIND && c.reason == EXPORTS_WITHDRAWN)
        .map(|c| c.message.as_str())
}

pub(super) fn plan_autobind(
    o: &Observed,
    d: Option<&Discovered>,
    st: &ConnectionStatus,
    existing: Option<&BindingView>,
    auto_bind: bool,
) -> AutoBind {
    let Some(d) = d else { return AutoBind::Leave };
    if !auto_bind {
        return AutoBind::Leave;
    }
    if d.exports.is_empty() {
        // Two consecutive successful, empty discoveries before deleting (contract), and never
        // while a consumer CRD of the binding holds objects: the binding's teardown would
        // delete them, and a provider must not be able to cause that (autobind_condition says
        // so instead).
        return if existing.is_some()
            && st.empty_discoveries.unwrap_or(0) >= 2
            && o.holding.is_empty()
        {
            AutoBind::Delete
        } else {
            AutoBind::Leave
        };
    }
    if d.exports.len() > MAX_BINDING_APIS {
        // The binding's CRD refuses it: autobind_condition says why instead.
        return AutoBind::Leave;
    }
    let apis: Vec<String> = d.exports.iter().map(|e| e.api.name.clone()).collect();
    // Labels someone else added to the binding stay (they are not kbind's fields): only the
    // Connection's own must be there with its values.
    let labelled = |b: &BindingView| o.labels.iter().all(|(k, v)| b.labels.get(k) == Some(v));
    match existing {
        Some(b) if b.apis == apis && b.connection == o.name && labelled(b) => AutoBind::Leave,
        _ => AutoBind::Apply(apis),
    }
}
