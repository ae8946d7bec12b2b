use super::*;

const GET: Method = Method::GET;
const POST: Method = Method::POST;
const PATCH: Method = Method::PATCH;

#[test]
fn verdicts() {
    let p = Policy::default();
    let s = |c: u16| Some(StatusCode::from_u16(c).unwrap());
    let ms = Duration::from_millis;
    // `None`: done; `Some((lo, hi))`: retried after a wait in [lo, hi] (the backoff is
    // jittered: half a step to a step).
    type Case<'a> = (
        &'a str,
        Method,
        Option<StatusCode>,
        Option<&'a str>,
        u32,
        Option<(Duration, Duration)>,
    );
    let first = Some((ms(100), ms(200)));
    let cases: Vec<Case> = vec![
        ("ok read", GET, s(200), None, 0, None),
        ("not found", GET, s(404), None, 0, None),
        ("conflict write", PATCH, s(409), None, 0, None),
        ("429 write", PATCH, s(429), None, 0, first),
        (
            "429 honours Retry-After",
            POST,
            s(429),
            Some("2"),
            0,
            Some((ms(2000), ms(2000))),
        ),
        (
            "Retry-After capped",
            GET,
            s(503),
            Some("3600"),
            0,
            Some((ms(5000), ms(5000))),
        ),
        (
            "unparsable Retry-After falls back to backoff",
            GET,
            s(503),
            Some("soon"),
            2,
            Some((ms(400), ms(800))),
        ),
        ("500 read", GET, s(500), None, 1, Some((ms(200), ms(400)))),
        ("500 write: outcome unknown", POST, s(500), None, 0, None),
        ("reset read", GET, None, None, 0, first),
        ("reset write: outcome unknown", PATCH, None, None, 0, None),
        ("out of retries", GET, s(503), None, 4, None),
    ];
    for (what, m, st, ra, attempt, want) in cases {
        for _ in 0..20 {
            match (p.verdict(&m, st, ra, attempt), want) {
                (Verdict::Done, None) => {}
                (Verdict::RetryAfter(w), Some((lo, hi))) => {
                    assert!(lo <= w && w <= hi, "{what}: {w:?} not in [{lo:?}, {hi:?}]")
                }
                (got, want) => panic!("{what}: {got:?}, want {want:?}"),
            }
        }
    }
}

#[test]
fn backoff_is_capped() {
    let p = Policy::default();
    for attempt in [0, 3, 10, 40] {
        let w = p.backoff().wait(attempt, None);
        assert!(w <= Duration::from_secs(5), "{attempt}: {w:?}");
        assert!(w >= Duration::from_millis(100), "{attempt}: {w:?}");
    }
    assert_eq!(p.backoff().step(40), Duration::from_secs(5));
}

fn fast() -> RetryLayer {
    RetryLayer(Policy {
        retries: 2,
        base: Duration::from_millis(1),
        max_delay: Duration::from_millis(1),
        max_body: 1024,
    })
}

#[test]
fn attempts_and_waits_end_by_the_deadline() {
    let now = Instant::now();
    let l = Limits {
        deadline: now + Duration::from_secs(30),
        request_timeout: Duration::from_secs(60),
    };
    assert_eq!(
        attempt_bound(None, now),
        None,
        "no pass: kube's own timeouts only"
    );
    assert_eq!(
        attempt_bound(Some(&l), now),
        Some(Duration::from_secs(40)),
        "cut to the deadline plus its grace"
    );
    let late = now + Duration::from_secs(35);
    assert_eq!(attempt_bound(Some(&l), late), Some(Duration::from_secs(5)));
    let early = Limits {
        request_timeout: Duration::from_secs(2),
        ..l
    };
    assert_eq!(
        attempt_bound(Some(&early), now),
        Some(Duration::from_secs(2))
    );
    assert!(!wait_crosses_deadline(
        Some(&l),
        now,
        Duration::from_secs(5)
    ));
    assert!(wait_crosses_deadline(
        Some(&l),
        late,
        Duration::from_millis(1)
    ));
    assert!(!wait_crosses_deadline(
        None,
        late,
        Duration::from_secs(3600)
    ));
}

#[tokio::test]
async fn a_body_over_the_cap_fails_once_and_is_not_retried() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut svc = fast().layer(mock);
    let get = Request::get("/openapi/v3").body(Body::empty()).unwrap();
    let call = tokio::spawn(async move { svc.ready().await?.call(get).await });
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new(Body::from(vec![b'x'; 4096])));
    let err = call.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("larger than 1024 bytes"), "{err}");
    assert!(
        !matches!(
            tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await,
            Ok(Some(_))
        ),
        "not sent again"
    );
}

#[tokio::test]
async fn a_dropped_read_is_retried_and_a_dropped_write_is_not() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut svc = fast().layer(mock);
    let get = Request::get("/api/v1/namespaces")
        .body(Body::empty())
        .unwrap();
    let call = tokio::spawn(async move { svc.ready().await?.call(get).await });
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error("connection reset by peer");
    let (again, send) = handle.next_request().await.unwrap();
    assert_eq!(again.uri(), "/api/v1/namespaces", "the same request again");
    send.send_response(Response::new(Body::from(b"{}".to_vec())));
    let resp = call.await.unwrap().unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"{}");

    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut svc = fast().layer(mock);
    let post = Request::post("/api/v1/namespaces")
        .body(Body::from(b"{\"kind\":\"Namespace\"}".to_vec()))
        .unwrap();
    let call = tokio::spawn(async move { svc.ready().await?.call(post).await });
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error("connection reset by peer");
    let err = call.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("reset"), "{err}");
}

#[tokio::test]
async fn a_throttled_write_is_sent_again_with_its_body() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut svc = fast().layer(mock);
    let patch = Request::patch("/apis/x/v1/things/a")
        .body(Body::from(b"{\"spec\":{}}".to_vec()))
        .unwrap();
    let call = tokio::spawn(async move { svc.ready().await?.call(patch).await });
    let (_, send) = handle.next_request().await.unwrap();
    let mut throttled = Response::new(Body::empty());
    *throttled.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    send.send_response(throttled);
    let (again, send) = handle.next_request().await.unwrap();
    let body = again.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"{\"spec\":{}}");
    send.send_response(Response::new(Body::empty()));
    assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
}
