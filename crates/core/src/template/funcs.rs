//! Filters, tests and functions added to minijinja's builtins.

use super::cmp_rewrite::CMP_FN;
use super::text::text_form;
use super::*;

pub(super) fn register(env: &mut Environment<'static>) {
    env.add_filter("fromjson", fromjson);
    env.add_filter("keys", keys);
    env.add_filter("values", values);
    env.add_filter("string", string);
    env.add_filter("b64encode", b64encode);
    env.add_filter("b64decode", b64decode);
    env.add_function("now", now);
    env.add_function(CMP_FN, lenient_cmp);
}

/// `s | fromjson`: parse a JSON string.
fn fromjson(s: &str) -> Result<MjValue, MjError> {
    let v: Value = serde_json::from_str(s)
        .map_err(|e| MjError::new(ErrorKind::InvalidOperation, format!("fromjson: {e}")))?;
    Ok(MjValue::from(Serde(&v)))
}

fn map_keys(v: &MjValue, filter: &str) -> Result<Vec<MjValue>, MjError> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => Ok(Vec::new()),
        ValueKind::Map => Ok(v.try_iter()?.collect()),
        kind => Err(MjError::new(
            ErrorKind::InvalidOperation,
            format!("{filter}: expected a mapping, got {kind}"),
        )),
    }
}

/// `m | keys`: the keys of a mapping as a list.
fn keys(v: &MjValue) -> Result<MjValue, MjError> {
    Ok(MjValue::from(map_keys(v, "keys")?))
}

/// `m | values`: the values of a mapping as a list.
fn values(v: &MjValue) -> Result<MjValue, MjError> {
    map_keys(v, "values")?
        .iter()
        .map(|k| v.get_item(k))
        .collect::<Result<Vec<_>, _>>()
        .map(MjValue::from)
}

/// `x | string`: the same text a mixed template would render.
fn string(v: &MjValue) -> Result<String, MjError> {
    Ok(match text_form(v)? {
        Some(text) => text,
        None => v.to_string(),
    })
}

/// `s | b64encode`: standard base64 (with padding) of the UTF-8 bytes.
fn b64encode(v: &MjValue) -> Result<String, MjError> {
    let bytes: Vec<u8> = match v.as_bytes() {
        Some(b) => b.to_vec(),
        None => string(v)?.into_bytes(),
    };
    Ok(base64::encode(&bytes))
}

/// `s | b64decode`: decode standard or URL-safe base64 to UTF-8 text.
fn b64decode(s: &str) -> Result<String, MjError> {
    let bytes = base64::decode(s)
        .ok_or_else(|| MjError::new(ErrorKind::InvalidOperation, "b64decode: invalid base64"))?;
    String::from_utf8(bytes).map_err(|_| {
        MjError::new(
            ErrorKind::InvalidOperation,
            "b64decode: decoded bytes are not UTF-8",
        )
    })
}

/// `now()`: the current UTC time, RFC 3339.
fn now() -> Result<String, MjError> {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .map_err(|e| MjError::new(ErrorKind::InvalidOperation, format!("now(): {e}")))
}

/// The ordering comparison used by conditions: false when an operand is
/// undefined or null, or when the operands are not comparable.
fn lenient_cmp(a: MjValue, op: &str, b: MjValue) -> bool {
    let numeric = |v: &MjValue| matches!(v.kind(), ValueKind::Number | ValueKind::Bool);
    let comparable = if numeric(&a) || numeric(&b) {
        numeric(&a) && numeric(&b)
    } else {
        a.kind() == b.kind() && !matches!(a.kind(), ValueKind::Undefined | ValueKind::None)
    };
    if !comparable {
        return false;
    }
    let ord = a.cmp(&b);
    match op {
        "<" => ord.is_lt(),
        "<=" => ord.is_le(),
        ">" => ord.is_gt(),
        ">=" => ord.is_ge(),
        _ => false,
    }
}
