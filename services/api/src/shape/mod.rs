//! The decisions of the handlers, as plain functions over plain data: how
//! a status is spelled, which executions a filter keeps, what an event
//! looks like to a client, what a request names in the catalog. Handlers
//! read, call these, and answer.

pub mod catalog;
pub mod credentials;
pub mod dialect;
pub mod events;
pub mod executions;
pub mod params;
pub mod status;
