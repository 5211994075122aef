//! A mock apiserver for the writers' unit tests (as controller-rs tests its
//! reconciler): each request a client sends comes out of the handle, and the test
//! checks it and answers.

use hyper::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::Value;

/// A client whose apiserver is the test.
pub fn mock_apiserver() -> (
    Client,
    tower_test::mock::Handle<Request<Body>, Response<Body>>,
) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), handle)
}

/// An answer with `status` and the JSON `body`.
pub fn answer(status: u16, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

/// A request's body, as JSON.
pub async fn body(request: Request<Body>) -> Value {
    let bytes = request.into_body().collect_bytes().await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}
