use super::*;
use crate::relsync::spicedb::Obj;
use serde_json::json;

#[test]
fn delete_answers() {
    let ok = [
        (
            json!({"deletionProgress": "DELETION_PROGRESS_COMPLETE"}),
            (0, false),
        ),
        (
            json!({"deletionProgress": "DELETION_PROGRESS_COMPLETE", "relationshipsDeletedCount": "7"}),
            (7, false),
        ),
        (
            json!({"deletionProgress": "DELETION_PROGRESS_PARTIAL", "relationshipsDeletedCount": "1000"}),
            (1000, true),
        ),
        (
            json!({"deletionProgress": "DELETION_PROGRESS_PARTIAL", "relationshipsDeletedCount": 3}),
            (3, true),
        ),
        // No count (an older server): a partial deletion reached the limit.
        (
            json!({"deletionProgress": "DELETION_PROGRESS_PARTIAL"}),
            (u64::from(DELETE_LIMIT), true),
        ),
        (json!({}), (0, false)),
    ];
    for (v, want) in ok {
        assert_eq!(parse_delete(&v).unwrap(), want, "{v}");
    }
    for bad in [
        json!({"deletionProgress": "DELETION_PROGRESS_PARTIAL", "relationshipsDeletedCount": "0"}),
        json!({"relationshipsDeletedCount": "many"}),
        json!({"relationshipsDeletedCount": -1}),
        json!({"relationshipsDeletedCount": [1]}),
    ] {
        assert!(parse_delete(&bad).is_err(), "{bad}");
    }
}

/// Read one HTTP/1.1 request (headers and a Content-Length body) off `sock`.
async fn read_request(sock: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1024];
    loop {
        let n = sock.read(&mut byte).await.expect("request");
        assert!(n > 0, "the client closed before its request was whole");
        buf.extend_from_slice(&byte[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().expect("length"));
        if buf.len() >= end + 4 + len {
            return;
        }
    }
}

/// An export cut off mid-stream is read again from the start, and what the first attempt
/// delivered is dropped (`Collect::restart`): the snapshot a large relsync window diffs
/// against must not hold a relationship twice, nor half a stream.
#[tokio::test]
async fn a_cut_export_is_read_again_from_the_start_without_what_the_cut_one_gave() {
    use tokio::io::AsyncWriteExt;
    let rel = |id: &str| Rel {
        resource: Obj::new("slack_channel", format!("ns/src/{id}")),
        relation: "member".into(),
        subject: Obj::new("user", "ada"),
    };
    let page = |ids: &[&str]| {
        let rels: Vec<Value> = ids.iter().map(|id| rel_json(&rel(id))).collect();
        json!({"result": {"relationships": rels}}).to_string()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (first, second) = (page(&["C1", "C2"]), page(&["C3"]));
    let server = tokio::spawn(async move {
        // First attempt: one whole page, then the connection drops inside the stream.
        let (mut sock, _) = listener.accept().await.unwrap();
        read_request(&mut sock).await;
        let line = format!("{first}\n");
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
        let chunk = format!("{:x}\r\n{line}\r\n", line.len());
        sock.write_all(format!("{head}{chunk}").as_bytes())
            .await
            .unwrap();
        sock.flush().await.unwrap();
        drop(sock);
        // Second attempt: the whole export.
        let (mut sock, _) = listener.accept().await.unwrap();
        read_request(&mut sock).await;
        let body = format!("{first}\n{second}\n");
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        sock.write_all(answer.as_bytes()).await.unwrap();
        sock.shutdown().await.unwrap();
    });
    let store = HttpStore::new(&base, Token::new("test-key")).unwrap();
    let mut got: Vec<Rel> = Vec::new();
    store
        .read_bulk(
            &Filter {
                resource_type: "slack_channel".into(),
                ..Default::default()
            },
            &mut got,
        )
        .await
        .expect("the second attempt reads the whole export");
    server.await.expect("both attempts were served");
    assert_eq!(got, vec![rel("C1"), rel("C2"), rel("C3")]);
}

#[test]
fn relationship_json_round_trips() {
    let r = Rel {
        resource: Obj::new("slack_channel", "ns/src/C1"),
        relation: "member".into(),
        subject: Obj::new("user", "ada+40example+2Ecom"),
    };
    let line = json!({"result": {"relationship": rel_json(&r)}}).to_string();
    let mut got: Vec<Rel> = Vec::new();
    parse_line(line.as_bytes(), &mut got).unwrap();
    // An export page, with an escaped id (decoded, not borrowed).
    let page = json!({"result": {"relationships": [rel_json(&r), rel_json(&r)]}}).to_string();
    parse_line(page.replace("C1", "C\\u0031").as_bytes(), &mut got).unwrap();
    assert_eq!(got, vec![r.clone(), r.clone(), r.clone()]);
    for bad in [
        r#"{"result": {}}"#,
        r#"{"result": {"relationship": {"resource": {}}}}"#,
        r#"{"error": {"code": 9, "message": "the read was cancelled"}}"#,
        "not json",
    ] {
        assert!(parse_line(bad.as_bytes(), &mut got).is_err(), "{bad}");
    }
    assert!(parse_line(b"  ", &mut got).is_ok());
    assert_eq!(
        r.to_string(),
        "slack_channel:ns/src/C1#member@user:ada+40example+2Ecom"
    );
}
