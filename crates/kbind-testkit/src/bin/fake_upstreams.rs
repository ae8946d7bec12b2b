//! Runs the local Slack and SCIM stand-ins for the demo, with a small sample directory.
//! Usage: kbind-fake-upstreams --slack-port P --scim-port Q --slack-token T --scim-token U
//! [--host IP] (default 127.0.0.1; the real node's tests serve them on its node IP)

#![forbid(unsafe_code)]

use kbind_testkit::{scim, slack};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port = |n: &str| arg(n).and_then(|p| p.parse().ok()).unwrap_or(0);
    let users = vec![
        slack::User {
            id: "U1".into(),
            email: Some("ada@example.com".into()),
            ..Default::default()
        },
        slack::User {
            id: "U2".into(),
            email: Some("grace@example.com".into()),
            ..Default::default()
        },
        slack::User {
            id: "U3".into(),
            email: None,
            ..Default::default()
        },
        slack::User {
            id: "USLACKBOT".into(),
            ..Default::default()
        },
    ];
    let ws = slack::Workspace {
        team_id: "T1".into(),
        token: arg("--slack-token").unwrap_or_default(),
        users,
        channels: vec![
            slack::Channel {
                id: "C1".into(),
                name: "general".into(),
                members: vec!["U1".into(), "U2".into(), "U3".into()],
                ..Default::default()
            },
            slack::Channel {
                id: "C2".into(),
                name: "infra".into(),
                is_private: true,
                members: vec!["U2".into()],
                ..Default::default()
            },
        ],
        max_page: 100,
        ..Default::default()
    };
    let dir = scim::Directory {
        token: arg("--scim-token").unwrap_or_default(),
        users: vec![scim::ScimUser {
            id: "u1".into(),
            user_name: "ada".into(),
            emails: vec![("ada@example.com".into(), true)],
            active: true,
        }],
        groups: vec![scim::ScimGroup {
            id: "g1".into(),
            display_name: "engineering".into(),
            members: vec!["u1".into()],
        }],
        max_results: 100,
        ..Default::default()
    };
    let host: std::net::IpAddr = match arg("--host") {
        Some(h) => h
            .parse()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
        None => std::net::IpAddr::from([127, 0, 0, 1]),
    };
    let s = slack::start_at(ws, (host, port("--slack-port")).into()).await?;
    let c = scim::start_at(dir, (host, port("--scim-port")).into()).await?;
    eprintln!("fake upstreams: slack {} scim {}", s.url(), c.url());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
