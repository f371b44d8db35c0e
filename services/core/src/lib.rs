//! noetl-core: the NoETL canonical v10 playbook language.
//!
//! Reading (`yaml`, `load`), normalising (`normalize`), validating
//! (`validate`, `diagnostic`), templating (`template`) and the pure evaluation
//! functions the services call (`merge`, `policy`, `routing`, `reduce`).

pub mod diagnostic;
pub mod load;
pub mod merge;
pub mod model;
pub mod normalize;
pub mod outcome;
pub mod policy;
pub mod reduce;
pub mod routing;
pub mod schema;
pub mod sql;
pub mod template;
pub mod tool;
pub mod validate;
pub mod workbook;
pub mod yaml;

pub use model::*;
pub use outcome::*;
