//! One module per subcommand.

pub mod common;
pub mod events;
pub mod exec;
pub mod run;
pub mod schema;
pub mod serve;
pub mod validate;
