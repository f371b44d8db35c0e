//! The wire contract of the NoETL mesh: protobuf messages generated from
//! `proto/noetl.proto`. Subject names live in `noetl-mesh`, not here.

#![allow(clippy::derive_partial_eq_without_eq)]

/// Version 1 of the wire contract.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/noetl.v1.rs"));
}

pub mod codec;

pub use prost::Message;
pub use v1::*;
