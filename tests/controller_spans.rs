//! The controller's writes in the log: each a span of its own inside the pass
//! that made it, ending with its outcome, as `RUST_LOG=berth=debug` shows them.

mod support;

use std::sync::Arc;

use berth::controller::writes::{Kind, Rates, Writes};
use tokio::sync::watch;
use tracing::Instrument;

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure("no", "Reason")
            .with_code(code)
            .boxed(),
    )
}

#[tokio::test]
async fn each_write_is_a_span_with_its_kind_and_outcome() {
    support::logs::capture();
    let (_leading, receiver) = watch::channel(true);
    let writes = Writes::new(Arc::default(), receiver, Rates::all(100));
    writes
        .make(Kind::Release, async { Ok(()) })
        .instrument(tracing::info_span!("release pass", test = "spans"))
        .await
        .unwrap();
    let _ = writes
        .make(Kind::Node, async { Err::<(), _>(api_error(409)) })
        .instrument(tracing::info_span!("nodes pass", test = "spans"))
        .await;
    let logged = support::logs::logged();
    assert!(
        logged.contains(
            "release pass{test=\"spans\"}:write{kind=\"release\"}: berth::controller::writes: \
             written outcome=\"ok\""
        ),
        "{logged}"
    );
    assert!(
        logged.contains(
            "nodes pass{test=\"spans\"}:write{kind=\"node\"}: berth::controller::writes: \
             written outcome=\"conflict\""
        ),
        "{logged}"
    );
}
