//! One module per subcommand.

pub mod admin;
pub mod admin_token;
pub mod common;
pub mod credential;
pub mod events;
pub mod exec;
pub mod exec_pause;
pub mod exec_retry;
pub mod exit;
pub mod health_http;
pub mod join;
pub mod local;
pub mod migrate;
pub mod playbook;
pub mod retry;
pub mod run;
pub mod schedule;
pub mod schema;
pub mod serve;
pub mod serve_api;
pub mod source;
pub mod tail_filter;
pub mod tree;
pub mod validate;
pub mod why;
