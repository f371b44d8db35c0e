//! JSON ⇄ PostgreSQL values: parameters by the statement's parameter
//! types, row cells by their column types.

use std::error::Error;

use bytes::{BufMut, BytesMut};
use serde_json::{json, Value};
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, Kind, ToSql, Type};

type BoxError = Box<dyn Error + Sync + Send>;

/// A JSON value bound to a parameter of type `ty`. Its `Debug` form (which
/// tokio-postgres logs at debug level) shows the value's shape, never the
/// value: a parameter may carry a credential.
#[derive(Clone)]
pub struct Param(pub Value);

impl std::fmt::Debug for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Value::String(s) => write!(f, "Param(<string of {} bytes>)", s.len()),
            v => write!(f, "Param(<{}>)", kind_of(v)),
        }
    }
}

fn err(v: &Value, ty: &Type) -> BoxError {
    format!(
        "cannot send {} as {} (cast in SQL, e.g. $1::text::{})",
        kind_of(v),
        ty.name(),
        ty.name()
    )
    .into()
}

use noetl_core::json_type as kind_of;

fn int(v: &Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

impl ToSql for Param {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let v = &self.0;
        if v.is_null() {
            return Ok(IsNull::Yes);
        }
        match ty.kind() {
            Kind::Array(elem) => {
                let Value::Array(items) = v else {
                    return Err(format!(
                        "cannot send {} as {}[] (send a list)",
                        kind_of(v),
                        elem.name()
                    )
                    .into());
                };
                let params: Vec<Param> = items.iter().cloned().map(Param).collect();
                params.to_sql(ty, out)
            }
            Kind::Domain(base) => self.to_sql(base, out),
            Kind::Enum(_) => {
                let Value::String(s) = v else {
                    return Err(err(v, ty));
                };
                out.put_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            _ => scalar_to_sql(v, ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// A non-null JSON value bound to a parameter of a base type: one arm per
/// family of PostgreSQL types.
fn scalar_to_sql(v: &Value, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
    match *ty {
        Type::BOOL
        | Type::INT2
        | Type::INT4
        | Type::INT8
        | Type::OID
        | Type::FLOAT4
        | Type::FLOAT8
        | Type::NUMERIC => number_to_sql(v, ty, out),
        Type::TIMESTAMPTZ | Type::TIMESTAMP | Type::DATE => time_to_sql(v, ty, out),
        Type::JSON | Type::JSONB => v.to_sql(ty, out),
        Type::UUID => {
            let s = v.as_str().ok_or_else(|| err(v, ty))?;
            uuid::Uuid::parse_str(s)?.to_sql(ty, out)
        }
        Type::BYTEA => {
            let s = v.as_str().ok_or_else(|| err(v, ty))?;
            match s.strip_prefix("\\x") {
                Some(h) => out.put_slice(&hex::decode(h)?),
                None => out.put_slice(s.as_bytes()),
            }
            Ok(IsNull::No)
        }
        _ => text_to_sql(v, ty, out),
    }
}

/// Booleans and numbers (a string holding one is taken too).
fn number_to_sql(v: &Value, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
    match *ty {
        Type::BOOL => match v {
            Value::Bool(b) => b.to_sql(ty, out),
            Value::String(s) if s == "true" || s == "false" => (s == "true").to_sql(ty, out),
            _ => Err(err(v, ty)),
        },
        Type::INT2 => {
            let n = int(v).ok_or_else(|| err(v, ty))?;
            i16::try_from(n)?.to_sql(ty, out)
        }
        Type::INT4 => {
            let n = int(v).ok_or_else(|| err(v, ty))?;
            i32::try_from(n)?.to_sql(ty, out)
        }
        Type::INT8 => int(v).ok_or_else(|| err(v, ty))?.to_sql(ty, out),
        Type::OID => {
            let n = int(v).ok_or_else(|| err(v, ty))?;
            u32::try_from(n)?.to_sql(ty, out)
        }
        Type::FLOAT4 | Type::FLOAT8 => {
            let f = v
                .as_f64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                .ok_or_else(|| err(v, ty))?;
            if *ty == Type::FLOAT4 {
                (f as f32).to_sql(ty, out)
            } else {
                f.to_sql(ty, out)
            }
        }
        _ => {
            let text = match v {
                Value::Number(n) => n.to_string(),
                Value::String(s) => s.clone(),
                _ => return Err(err(v, ty)),
            };
            numeric_to_sql(&text, out)?;
            Ok(IsNull::No)
        }
    }
}

/// Timestamps (RFC 3339 with a zone; without one for `timestamp`) and
/// dates, from text.
fn time_to_sql(v: &Value, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
    let s = v.as_str().ok_or_else(|| err(v, ty))?;
    match *ty {
        Type::TIMESTAMPTZ => {
            let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)?;
            t.to_sql(ty, out)
        }
        Type::TIMESTAMP => {
            let t = parse_timestamp(s).ok_or_else(|| err(v, ty))?;
            t.to_sql(ty, out)
        }
        _ => {
            let fmt = time::macros::format_description!("[year]-[month]-[day]");
            time::Date::parse(s, &fmt)?.to_sql(ty, out)
        }
    }
}

/// Text-like types (text, varchar, bpchar, name, unknown, citext...): the
/// binary form is the UTF-8 text; any other type cannot be sent.
fn text_to_sql(v: &Value, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
    let text_like = matches!(
        *ty,
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN
    ) || ty.name() == "citext";
    if !text_like {
        return Err(err(v, ty));
    }
    match v {
        Value::String(s) => out.put_slice(s.as_bytes()),
        other => out.put_slice(other.to_string().as_bytes()),
    }
    Ok(IsNull::No)
}

fn parse_timestamp(s: &str) -> Option<time::PrimitiveDateTime> {
    let s = s.trim().replace('T', " ");
    let s = s.trim_end_matches('Z');
    let full = time::macros::format_description!(
        "[year]-[month]-[day] [hour]:[minute]:[second].[subsecond]"
    );
    let secs = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    time::PrimitiveDateTime::parse(s, &full)
        .or_else(|_| time::PrimitiveDateTime::parse(s, &secs))
        .ok()
}

/// Encode a decimal string in PostgreSQL's binary NUMERIC form.
pub fn numeric_to_sql(text: &str, out: &mut BytesMut) -> Result<(), BoxError> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("nan") {
        out.put_i16(0);
        out.put_i16(0);
        out.put_u16(0xC000);
        out.put_u16(0);
        return Ok(());
    }
    let (neg, t) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return Err(format!("{text:?} is not a decimal number").into());
    }
    let int = int.trim_start_matches('0');
    let mut groups: Vec<i16> = Vec::new();
    let ipad = (4 - int.len() % 4) % 4;
    let int_p = format!("{}{int}", "0".repeat(ipad));
    for c in int_p.as_bytes().chunks(4) {
        groups.push(std::str::from_utf8(c)?.parse()?);
    }
    let mut weight = groups.len() as i16 - 1;
    let fpad = (4 - frac.len() % 4) % 4;
    let frac_p = format!("{frac}{}", "0".repeat(fpad));
    for c in frac_p.as_bytes().chunks(4) {
        groups.push(std::str::from_utf8(c)?.parse()?);
    }
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    out.put_i16(groups.len() as i16);
    out.put_i16(weight);
    out.put_u16(if neg && !groups.is_empty() { 0x4000 } else { 0 });
    out.put_u16(frac.len() as u16);
    for g in groups {
        out.put_i16(g);
    }
    Ok(())
}

/// Decode PostgreSQL's binary NUMERIC into its decimal text.
pub fn numeric_from_sql(raw: &[u8]) -> Result<String, BoxError> {
    let rd = |i: usize| -> Result<i16, BoxError> {
        raw.get(i..i + 2)
            .map(|b| i16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "short numeric".into())
    };
    let ndigits = rd(0)? as usize;
    let weight = rd(2)? as i32;
    let sign = rd(4)? as u16;
    let dscale = rd(6)? as usize;
    match sign {
        0xC000 => return Ok("NaN".into()),
        0xD000 => return Ok("Infinity".into()),
        0xF000 => return Ok("-Infinity".into()),
        _ => {}
    }
    let digits: Vec<i16> = (0..ndigits)
        .map(|k| rd(8 + 2 * k))
        .collect::<Result<_, _>>()?;
    let at = |i: i32| -> i16 {
        if i < 0 || i as usize >= digits.len() {
            0
        } else {
            digits[i as usize]
        }
    };
    let mut s = String::new();
    if sign == 0x4000 {
        s.push('-');
    }
    if weight < 0 {
        s.push('0');
    } else {
        for i in 0..=weight {
            if i == 0 {
                s.push_str(&at(i).to_string());
            } else {
                s.push_str(&format!("{:04}", at(i)));
            }
        }
    }
    if dscale > 0 {
        let mut f = String::new();
        let mut i = weight + 1;
        while f.len() < dscale {
            f.push_str(&format!("{:04}", at(i)));
            i += 1;
        }
        f.truncate(dscale);
        s.push('.');
        s.push_str(&f);
    }
    Ok(s)
}

/// One row cell as JSON.
pub struct Cell(pub Value);

impl<'a> FromSql<'a> for Cell {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        decode(ty, raw).map(Cell)
    }

    fn from_sql_null(_: &Type) -> Result<Self, BoxError> {
        Ok(Cell(Value::Null))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

fn float(f: f64) -> Value {
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or_else(|| Value::String(f.to_string()))
}

fn decode(ty: &Type, raw: &[u8]) -> Result<Value, BoxError> {
    match ty.kind() {
        Kind::Array(elem) => {
            use fallible_iterator::FallibleIterator;
            let array = postgres_protocol::types::array_from_sql(raw)?;
            let mut out = Vec::new();
            let mut it = array.values();
            while let Some(v) = it.next()? {
                out.push(match v {
                    None => Value::Null,
                    Some(bytes) => decode(elem, bytes)?,
                });
            }
            return Ok(Value::Array(out));
        }
        Kind::Domain(base) => return decode(base, raw),
        Kind::Enum(_) => return Ok(Value::String(String::from_utf8_lossy(raw).into())),
        _ => {}
    }
    Ok(match *ty {
        Type::BOOL => Value::Bool(bool::from_sql(ty, raw)?),
        Type::INT2 => json!(i16::from_sql(ty, raw)?),
        Type::INT4 => json!(i32::from_sql(ty, raw)?),
        Type::INT8 => json!(i64::from_sql(ty, raw)?),
        Type::OID => json!(u32::from_sql(ty, raw)?),
        Type::FLOAT4 => float(f32::from_sql(ty, raw)? as f64),
        Type::FLOAT8 => float(f64::from_sql(ty, raw)?),
        Type::NUMERIC => {
            let text = numeric_from_sql(raw)?;
            // A number when it survives a round trip through f64 (up to 15
            // significant digits), else its exact text.
            let significant = text.chars().filter(char::is_ascii_digit).count();
            match text.parse::<f64>() {
                Ok(f) if significant <= 15 && f.is_finite() => float(f),
                _ => Value::String(text),
            }
        }
        Type::JSON | Type::JSONB => Value::from_sql(ty, raw)?,
        Type::UUID => Value::String(uuid::Uuid::from_sql(ty, raw)?.to_string()),
        Type::TIMESTAMPTZ => Value::String(
            time::OffsetDateTime::from_sql(ty, raw)?
                .format(&time::format_description::well_known::Rfc3339)?,
        ),
        Type::TIMESTAMP => {
            let t = time::PrimitiveDateTime::from_sql(ty, raw)?;
            Value::String(
                t.assume_utc()
                    .format(&time::format_description::well_known::Rfc3339)?
                    .trim_end_matches('Z')
                    .to_string(),
            )
        }
        Type::DATE => Value::String(time::Date::from_sql(ty, raw)?.to_string()),
        Type::TIME => Value::String(time::Time::from_sql(ty, raw)?.to_string()),
        Type::BYTEA => Value::String(format!("\\x{}", hex::encode(raw))),
        Type::CHAR => json!((i8::from_sql(ty, raw)? as u8 as char).to_string()),
        _ => match std::str::from_utf8(raw) {
            // text, varchar, bpchar, name, citext, xml...
            Ok(s) => Value::String(s.to_string()),
            Err(_) => json!({"type": ty.name(), "hex": hex::encode(raw)}),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numerics_round_trip_through_the_binary_form() {
        for s in [
            "0",
            "1",
            "-1",
            "12345.6",
            "0.05",
            "-0.0001",
            "10000",
            "123456789.123456789",
            "1.50",
        ] {
            let mut b = BytesMut::new();
            numeric_to_sql(s, &mut b).unwrap();
            let back = numeric_from_sql(&b).unwrap();
            let want = if s == "-0.0001" { "-0.0001" } else { s };
            assert_eq!(back, want, "{s}");
        }
        assert!(numeric_to_sql("12a", &mut BytesMut::new()).is_err());
    }
}
