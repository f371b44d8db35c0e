//! Reducers: aggregate `set_ctx` writes from loop iterations atomically
//! (declared as `loop.spec.policy.reducers: {<ctx key>: <op>}`).
//!
//! | op | contribution | result |
//! |---|---|---|
//! | `append` | any value | list of contributions |
//! | `extend` | a list | concatenation |
//! | `sum` | a number | sum |
//! | `min` / `max` | a number | minimum / maximum |
//! | `merge` | an object | shallow merge (later keys win) |

use serde_json::{Map, Value};

/// The names of the reducer operations, as [`ReducerOp::parse`] reads
/// them (`noetl validate` refuses any other, E045).
pub const OPS: &[&str] = &["append", "extend", "sum", "min", "max", "merge"];

/// A reducer operation (its name on the wire: `append`, `sum`...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReducerOp {
    /// Collect contributions in a list.
    Append,
    /// Concatenate list contributions.
    Extend,
    /// Add numbers.
    Sum,
    /// Keep the smallest number.
    Min,
    /// Keep the largest number.
    Max,
    /// Merge objects.
    Merge,
}

/// A reducer could not fold a contribution.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReduceError {
    /// The op name is not one of the six.
    #[error("unknown reducer `{0}`: use append, extend, sum, min, max or merge")]
    UnknownOp(String),
    /// The contribution has the wrong type for the op.
    #[error("reducer `{op}` cannot take {found} (ctx key `{key}`)")]
    WrongType {
        /// Op name.
        op: &'static str,
        /// Offending key.
        key: String,
        /// Type found.
        found: &'static str,
    },
}

impl ReducerOp {
    /// Parse an op name.
    pub fn parse(s: &str) -> Result<Self, ReduceError> {
        Ok(match s {
            "append" => Self::Append,
            "extend" => Self::Extend,
            "sum" => Self::Sum,
            "min" => Self::Min,
            "max" => Self::Max,
            "merge" => Self::Merge,
            other => return Err(ReduceError::UnknownOp(other.to_string())),
        })
    }

    /// The op's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Append => "append",
            Self::Extend => "extend",
            Self::Sum => "sum",
            Self::Min => "min",
            Self::Max => "max",
            Self::Merge => "merge",
        }
    }
}

fn number(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn num_value(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        Value::from(x as i64)
    } else {
        serde_json::Number::from_f64(x)
            .map(Value::Number)
            .unwrap_or(Value::Null)
    }
}

/// Fold contribution `v` into accumulator `acc` (`None` = nothing yet).
pub fn fold(
    op: ReducerOp,
    key: &str,
    acc: Option<&Value>,
    v: &Value,
) -> Result<Value, ReduceError> {
    let wrong = |found: &Value| ReduceError::WrongType {
        op: op.name(),
        key: key.to_string(),
        found: crate::json_type(found),
    };
    Ok(match op {
        ReducerOp::Append => {
            let mut list = match acc {
                Some(Value::Array(a)) => a.clone(),
                None | Some(Value::Null) => Vec::new(),
                Some(other) => vec![other.clone()],
            };
            list.push(v.clone());
            Value::Array(list)
        }
        ReducerOp::Extend => {
            let Value::Array(items) = v else {
                return Err(wrong(v));
            };
            let mut list = match acc {
                Some(Value::Array(a)) => a.clone(),
                None | Some(Value::Null) => Vec::new(),
                Some(other) => return Err(wrong(other)),
            };
            list.extend(items.iter().cloned());
            Value::Array(list)
        }
        ReducerOp::Sum | ReducerOp::Min | ReducerOp::Max => {
            let x = number(v).ok_or_else(|| wrong(v))?;
            let a = match acc {
                None | Some(Value::Null) => return Ok(num_value(x)),
                Some(a) => number(a).ok_or_else(|| wrong(a))?,
            };
            num_value(match op {
                ReducerOp::Sum => a + x,
                ReducerOp::Min => a.min(x),
                _ => a.max(x),
            })
        }
        ReducerOp::Merge => {
            let Value::Object(m) = v else {
                return Err(wrong(v));
            };
            let mut out = match acc {
                Some(Value::Object(a)) => a.clone(),
                None | Some(Value::Null) => Map::new(),
                Some(other) => return Err(wrong(other)),
            };
            for (k, x) in m {
                out.insert(k.clone(), x.clone());
            }
            Value::Object(out)
        }
    })
}

/// Fold a partial aggregate `part` (built by [`fold`] from contributions)
/// into `acc`: for append, the part's items are appended one by one.
pub fn combine(
    op: ReducerOp,
    key: &str,
    acc: Option<&Value>,
    part: &Value,
) -> Result<Value, ReduceError> {
    match (op, part) {
        (ReducerOp::Append, Value::Array(items)) => {
            let mut cur = acc.cloned();
            for it in items {
                cur = Some(fold(op, key, cur.as_ref(), it)?);
            }
            Ok(cur.unwrap_or(Value::Array(Vec::new())))
        }
        _ => fold(op, key, acc, part),
    }
}

/// The reducers a loop declares (`loop.spec.policy.reducers`), parsed.
pub fn declared(policy: Option<&Value>) -> Result<Vec<(String, ReducerOp)>, ReduceError> {
    let Some(Value::Object(r)) = policy.and_then(|p| p.get("reducers")) else {
        return Ok(Vec::new());
    };
    r.iter()
        .map(|(k, v)| {
            let name = v
                .as_str()
                .or_else(|| v.get("op").and_then(Value::as_str))
                .unwrap_or("");
            ReducerOp::parse(name).map(|op| (k.clone(), op))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn all(op: ReducerOp, xs: &[Value]) -> Value {
        let mut acc = None;
        for x in xs {
            acc = Some(fold(op, "k", acc.as_ref(), x).unwrap());
        }
        acc.unwrap()
    }

    #[test]
    fn each_reducer_folds() {
        assert_eq!(
            all(ReducerOp::Append, &[json!(1), json!([2])]),
            json!([1, [2]])
        );
        assert_eq!(
            all(ReducerOp::Extend, &[json!([1]), json!([2, 3])]),
            json!([1, 2, 3])
        );
        assert_eq!(
            all(ReducerOp::Sum, &[json!(1), json!(2.5), json!(3)]),
            json!(6.5)
        );
        assert_eq!(all(ReducerOp::Sum, &[json!(1), json!(2)]), json!(3));
        assert_eq!(
            all(ReducerOp::Min, &[json!(4), json!(2), json!(9)]),
            json!(2)
        );
        assert_eq!(
            all(ReducerOp::Max, &[json!(4), json!(2), json!(9)]),
            json!(9)
        );
        assert_eq!(
            all(
                ReducerOp::Merge,
                &[json!({"a": 1}), json!({"b": 2, "a": 3})]
            ),
            json!({"a": 3, "b": 2})
        );
    }

    #[test]
    fn combine_appends_parts_item_by_item() {
        let part = all(ReducerOp::Append, &[json!("x"), json!("y")]);
        let acc = json!(["w"]);
        assert_eq!(
            combine(ReducerOp::Append, "k", Some(&acc), &part).unwrap(),
            json!(["w", "x", "y"])
        );
        assert_eq!(
            combine(ReducerOp::Sum, "k", Some(&json!(2)), &json!(3)).unwrap(),
            json!(5)
        );
    }

    #[test]
    fn type_errors_and_unknown_ops_are_named() {
        let e = fold(ReducerOp::Sum, "total", None, &json!("x")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "reducer `sum` cannot take a string (ctx key `total`)"
        );
        assert!(ReducerOp::parse("avg").is_err());
        let d = declared(Some(
            &json!({"reducers": {"t": "sum", "l": {"op": "append"}}}),
        ))
        .unwrap();
        assert_eq!(
            d,
            vec![
                ("t".to_string(), ReducerOp::Sum),
                ("l".to_string(), ReducerOp::Append)
            ]
        );
    }
}
