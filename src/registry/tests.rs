//! A registered pass is wired everywhere a user meets it: the command line, `kbind status`,
//! `kbind uninstall`, its RBAC, Job definitions, deploy component, chart and docs. Each test
//! names what is missing for which pass.

use std::path::{Path, PathBuf};

use kube::Resource;

use super::*;
use crate::api::catalog::{Collection, Export};
use crate::api::core::{Binding, ClusterBinding, Connection};
use crate::api::iam::Grant as IssuedGrant;
use crate::api::providers::{CatalogEntry, Grant};
use crate::api::relsync::RelationshipSource;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn kind_of<K: Resource<DynamicType = ()>>() -> (String, String) {
    (K::group(&()).into_owned(), K::kind(&()).into_owned())
}

#[test]
fn names_are_unique_and_found_by_name() {
    for (i, d) in JOBS.iter().enumerate() {
        assert!(
            JOBS[i + 1..].iter().all(|o| o.name != d.name),
            "{} is registered twice",
            d.name
        );
        assert_eq!(find(d.name), Some(d));
    }
    assert_eq!(find("nope"), None);
    assert!(PASSES.iter().all(|p| p.takes_lease && JOBS.contains(p)));
    assert!(
        JOBS.iter()
            .filter(|d| !d.takes_lease)
            .all(|d| d.jobs.is_empty() || d.name == "bind")
    );
}

#[test]
fn registered_kinds_are_the_api_types() {
    let named = [
        (CONNECTION, kind_of::<Connection>()),
        (CLUSTER_BINDING, kind_of::<ClusterBinding>()),
        (BINDING, kind_of::<Binding>()),
        (CATALOG_ENTRY, kind_of::<CatalogEntry>()),
        (TENANCY_GRANT, kind_of::<Grant>()),
        (RELATIONSHIP_SOURCE, kind_of::<RelationshipSource>()),
        (ISSUED_GRANT, kind_of::<IssuedGrant>()),
        (EXPORT, kind_of::<Export>()),
        (COLLECTION, kind_of::<Collection>()),
        (SECRET, kind_of::<k8s_openapi::api::core::v1::Secret>()),
    ];
    for (k, (group, kind)) in named {
        assert_eq!((k.group, k.kind), (group.as_str(), kind.as_str()));
    }
}

#[test]
fn status_shows_and_uninstall_releases_what_every_pass_names() {
    for p in PASSES {
        for k in p.shows {
            assert!(
                crate::status::shows(*k),
                "kbind status cannot show {}.{}, which pass {} names",
                k.kind,
                k.group,
                p.name
            );
        }
        for f in p.finalizers {
            assert!(
                crate::uninstall::releases(f),
                "kbind uninstall cannot release {} ({:?}), which pass {} adds",
                f.name,
                f.on,
                p.name
            );
        }
    }
    // And the other way: nothing is shown that no pass names.
    let shown = crate::status::shown(PASSES);
    assert_eq!(shown.len(), 9, "{shown:?}");
}

#[test]
fn every_job_has_its_own_docs_and_readme_row() {
    let readme = read("README.md");
    for d in JOBS {
        assert!(
            readme.contains(&format!("| `kbind {}` |", d.name)),
            "README.md has no row for kbind {}",
            d.name
        );
    }
    for p in PASSES {
        assert!(
            repo(&format!("docs/{}.md", p.name)).is_file(),
            "no docs/{}.md",
            p.name
        );
    }
}

#[test]
fn every_pass_has_its_rbac_jobs_component_and_chart_entry() {
    let values = read("charts/kbind/values.yaml");
    for p in PASSES {
        let rbac = p.rbac_file();
        assert!(repo(&rbac).is_file(), "{}: no {rbac}", p.name);
        let component = format!("deploy/components/{}/kustomization.yaml", p.role);
        let kustomization = read(&component);
        assert!(
            kustomization.contains(&format!("- {}-rbac.yaml", p.name)),
            "{component} does not list {rbac}"
        );
        assert!(
            kustomization.contains(&format!("jobs/{}", p.name)),
            "{component} does not build on jobs/{}",
            p.name
        );
        assert!(
            !p.jobs.is_empty() && p.jobs[0] == "cronjob.yaml",
            "{}: a pass's first Job definition is its CronJob",
            p.name
        );
        for job in p.jobs {
            let path = format!("jobs/{}/{job}", p.name);
            let text = read(&path);
            assert!(
                text.contains(&format!("namespace: {}", p.namespace)),
                "{path} does not run in {}",
                p.namespace
            );
            assert!(
                text.contains(&format!("- {}", p.name)),
                "{path} does not run kbind {}",
                p.name
            );
        }
        assert!(
            repo(&format!("charts/kbind/templates/{}.yaml", p.name)).is_file(),
            "the chart has no templates/{}.yaml",
            p.name
        );
        assert!(
            values.contains(&format!("\n  {}:\n", p.name)),
            "charts/kbind/values.yaml has no passes.{}",
            p.name
        );
    }
}

#[test]
fn the_passes_write_under_the_managers_their_descriptors_name() {
    assert_eq!(crate::resync::MANAGER, RESYNC.field_manager());
    assert_eq!(crate::resync::FINALIZER_MANAGER, RESYNC.finalizer_manager());
    assert_eq!(
        crate::relsync::cleanup::manager(&RELSYNC.field_manager()),
        RELSYNC.finalizer_manager()
    );
    assert_eq!(
        crate::issue::render::object_name("g"),
        keys::grant_object_name("g")
    );
}
