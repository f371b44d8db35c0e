//! noetl-api: NoETL's REST contract over the mesh (`noetl serve api`).
//!
//! A stateless HTTP service: it publishes execution requests and
//! cancellations on the mesh's subjects, reads the KV buckets (headers,
//! step records, plans, the catalog, the credential vault) and the event
//! stream, and never calls another service. Any number of replicas can
//! run. Routes, roles and what differs from NoETL's server are in
//! `docs/api.md`.
//!
//! Layout: [`contract`] (request and response bodies, with their OpenAPI
//! schemas), [`shape`] (the decisions, as plain functions), [`handlers`]
//! (read, decide, answer), [`auth`] and [`tokens`] (who may do what),
//! [`routes`] (which role each route needs; the OpenAPI document),
//! [`server`] (TLS, the auth mode, the drain), [`view`] (the status of
//! executions, followed: a status poll costs no round trip).

pub mod audit;
pub mod auth;
pub mod console;
pub mod contract;
pub mod error;
pub mod extract;
pub mod handlers;
pub mod limits;
pub mod logged;
pub mod middleware;
pub mod openapi;
pub mod read;
pub mod routes;
pub mod server;
pub mod shape;
pub mod state;
pub mod stream;
pub mod tokens;
pub mod view;

pub use limits::Limits;
pub use server::{load_tls, serve, ApiParams, ServeError, TlsFiles};
