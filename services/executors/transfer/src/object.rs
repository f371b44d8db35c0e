//! Rows in an object's bytes, and rows as an object's bytes, in the three
//! formats a transfer's `s3` / `gcs` side takes: JSON Lines (one object a
//! line), JSON (an array of objects, or the rows at `data_path`) and CSV
//! (a header row; an empty field is `null`). Plain functions, unit-tested
//! here; the I/O is `noetl_mesh::remote`'s.

use noetl_core::transfer::Format;
use serde_json::{Map, Value};

use crate::plan::{pick, rows_in, Layout, Rows};

/// Largest object a transfer reads (its rows are held in memory).
pub const MAX_OBJECT_BYTES: usize = 256 << 20;

/// The rows of an object in `format`, and their columns (a CSV's header,
/// else every key in first-seen order). `Err` says what is wrong and
/// where (line or row), never the object's contents.
pub fn rows_from(
    format: Format,
    bytes: &[u8],
    data_path: Option<&str>,
) -> Result<(Rows, Vec<String>), String> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    match format {
        Format::Json => {
            let doc: Value = serde_json::from_slice(bytes)
                .map_err(|e| format!("the object is not a JSON document ({e})"))?;
            rows_in(doc, data_path, Vec::new())
        }
        Format::JsonLines => {
            let text = std::str::from_utf8(bytes)
                .map_err(|e| format!("the object is not UTF-8 text ({e})"))?;
            let mut rows = Vec::new();
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Value>(line) {
                    Ok(Value::Object(m)) => rows.push(Value::Object(m)),
                    Ok(other) => {
                        return Err(format!(
                            "line {} is {}, not an object",
                            i + 1,
                            noetl_core::json_type(&other)
                        ))
                    }
                    Err(e) => return Err(format!("line {} is not JSON ({e})", i + 1)),
                }
            }
            rows_in(Value::Array(rows), None, Vec::new())
        }
        Format::Csv => csv_rows(bytes),
    }
}

fn csv_rows(bytes: &[u8]) -> Result<(Rows, Vec<String>), String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(bytes);
    let header = reader
        .headers()
        .map_err(|e| format!("the CSV header cannot be read ({e})"))?
        .clone();
    let mut columns: Vec<String> = Vec::with_capacity(header.len());
    for (i, name) in header.iter().enumerate() {
        let name = name.trim();
        if name.is_empty() {
            return Err(format!("column {} of the CSV header has no name", i + 1));
        }
        if columns.iter().any(|c| c == name) {
            return Err(format!("the CSV header names `{name}` twice"));
        }
        columns.push(name.to_string());
    }
    let mut rows = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let record = record.map_err(|e| format!("CSV row {} cannot be read ({e})", i + 1))?;
        let row: Map<String, Value> = columns
            .iter()
            .zip(record.iter())
            .map(|(c, v)| {
                let v = if v.is_empty() {
                    Value::Null
                } else {
                    Value::String(v.to_string())
                };
                (c.clone(), v)
            })
            .collect();
        rows.push(row);
    }
    Ok((rows, columns))
}

/// A value as one CSV field: text as is, `null` empty, numbers and
/// booleans as written in JSON, objects and arrays as JSON text.
fn csv_field(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The object's bytes: the rows through the layout's mapping, the
/// columns in its order.
pub fn object_bytes(format: Format, layout: &Layout, rows: &[Map<String, Value>]) -> Vec<u8> {
    let values = |r: &Map<String, Value>| -> Vec<Value> {
        layout.mapping.iter().map(|(_, src)| pick(r, src)).collect()
    };
    let mapped = rows.iter().map(|r| {
        layout
            .columns
            .iter()
            .cloned()
            .zip(values(r))
            .collect::<Map<String, Value>>()
    });
    match format {
        Format::JsonLines => {
            let mut out = Vec::new();
            for row in mapped {
                out.extend(Value::Object(row).to_string().into_bytes());
                out.push(b'\n');
            }
            out
        }
        Format::Json => Value::Array(mapped.map(Value::Object).collect())
            .to_string()
            .into_bytes(),
        Format::Csv => {
            let mut w = csv::Writer::from_writer(Vec::new());
            // Every record has one field per column and goes to a Vec: a
            // write cannot fail.
            let _ = w.write_record(&layout.columns);
            for r in rows {
                let _ = w.write_record(values(r).iter().map(csv_field));
            }
            w.into_inner().unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn layout(mapping: &[(&str, &str)]) -> Layout {
        Layout {
            mapping: mapping
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            columns: mapping.iter().map(|(a, _)| a.to_string()).collect(),
            key: vec![],
            key_index: vec![],
        }
    }

    #[test]
    fn json_lines_json_and_csv_become_rows() {
        let (rows, cols) = rows_from(
            Format::JsonLines,
            b"{\"id\": 1, \"n\": \"a\"}\n\n{\"id\": 2, \"x\": true}\n",
            None,
        )
        .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(cols, ["id", "n", "x"]);
        let (rows, _) = rows_from(
            Format::Json,
            br#"{"data": {"items": [{"id": 1}, {"id": 2}]}}"#,
            Some("data.items"),
        )
        .unwrap();
        assert_eq!(rows[1]["id"], 2);
        let (rows, cols) = rows_from(
            Format::Csv,
            "\u{feff}id,name,note\n1,\"Ada, L.\",\n2,Bo,\"say \"\"hi\"\"\"\n".as_bytes(),
            None,
        )
        .unwrap();
        assert_eq!(cols, ["id", "name", "note"]);
        assert_eq!(
            Value::Object(rows[0].clone()),
            json!({"id": "1", "name": "Ada, L.", "note": null})
        );
        assert_eq!(rows[1]["note"], "say \"hi\"");
    }

    #[test]
    fn bad_objects_say_where_without_their_contents() {
        let e = rows_from(Format::JsonLines, b"{\"a\":1}\n[1]\n", None).unwrap_err();
        assert_eq!(e, "line 2 is a list, not an object");
        let e = rows_from(Format::JsonLines, b"{\"secret\": \"s3cr3t\"\n", None).unwrap_err();
        assert!(
            e.starts_with("line 1 is not JSON") && !e.contains("s3cr3t"),
            "{e}"
        );
        let e = rows_from(Format::Json, b"nope", None).unwrap_err();
        assert!(e.starts_with("the object is not a JSON document"), "{e}");
        let e = rows_from(Format::Csv, b"a,a\n1,2\n", None).unwrap_err();
        assert_eq!(e, "the CSV header names `a` twice");
        let e = rows_from(Format::Csv, b"a,b\n1,2,3\n", None).unwrap_err();
        assert!(e.starts_with("CSV row 1 cannot be read"), "{e}");
    }

    #[test]
    fn rows_are_written_through_the_mapping_in_each_format() {
        let rows = vec![
            json!({"id": 1, "user": {"name": "Ada, L."}, "tags": ["x"]}),
            json!({"id": 2, "user": {"name": null}, "tags": []}),
        ]
        .into_iter()
        .map(|v| v.as_object().cloned().unwrap())
        .collect::<Vec<_>>();
        let l = layout(&[("id", "id"), ("name", "user.name"), ("tags", "tags")]);
        let jsonl = String::from_utf8(object_bytes(Format::JsonLines, &l, &rows)).unwrap();
        assert_eq!(
            jsonl,
            "{\"id\":1,\"name\":\"Ada, L.\",\"tags\":[\"x\"]}\n{\"id\":2,\"name\":null,\"tags\":[]}\n"
        );
        let json: Value = serde_json::from_slice(&object_bytes(Format::Json, &l, &rows)).unwrap();
        assert_eq!(json[1], json!({"id": 2, "name": null, "tags": []}));
        let csv = String::from_utf8(object_bytes(Format::Csv, &l, &rows)).unwrap();
        assert_eq!(csv, "id,name,tags\n1,\"Ada, L.\",\"[\"\"x\"\"]\"\n2,,[]\n");
        // What was written reads back as the same rows (CSV: as text).
        let (back, cols) = rows_from(Format::Csv, csv.as_bytes(), None).unwrap();
        assert_eq!(cols, ["id", "name", "tags"]);
        assert_eq!(back[0]["name"], "Ada, L.");
        assert_eq!(back[1]["name"], Value::Null);
        assert_eq!(
            String::from_utf8(object_bytes(Format::Json, &l, &[])).unwrap(),
            "[]"
        );
    }
}
