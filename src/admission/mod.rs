//! The admission webhook: `POST /mutate`, `POST /validate`, health, readiness and
//! metrics, served over rustls. Handlers decode and answer; [`service`] decides.

pub mod body;
pub mod cel;
pub mod handlers;
pub mod review;
pub mod server;
pub mod service;
pub mod share;
pub mod state;
pub mod static_cel;
pub mod tls;
pub mod webhooks;
