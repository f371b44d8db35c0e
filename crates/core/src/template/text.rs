//! The text form of values in mixed templates, and the sink that bounds
//! a render's output.

use super::*;

/// A render sink that refuses output past [`MAX_TEMPLATE_OUTPUT_BYTES`]
/// (keeping the bytes, or only counting them).
pub(super) struct BoundedText {
    pub(super) out: Vec<u8>,
    pub(super) len: usize,
    pub(super) over: Option<usize>,
    pub(super) keep: bool,
}

impl BoundedText {
    /// Keeps what is written.
    pub(super) fn new() -> Self {
        Self::with(true)
    }

    pub(super) fn with(keep: bool) -> Self {
        Self {
            out: Vec::new(),
            len: 0,
            over: None,
            keep,
        }
    }
}

impl std::io::Write for BoundedText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let total = self.len.saturating_add(buf.len());
        if total > MAX_TEMPLATE_OUTPUT_BYTES {
            self.over = Some(total);
            return Err(std::io::Error::other("template output limit reached"));
        }
        self.len = total;
        if self.keep {
            self.out.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The text of `value` in mixed templates when it differs from minijinja's
/// default display (`None` = use the default).
pub(super) fn text_form(value: &MjValue) -> Result<Option<String>, MjError> {
    Ok(Some(match value.kind() {
        ValueKind::Undefined | ValueKind::None => String::new(),
        ValueKind::Bool => value.is_true().to_string(),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => {
            // Streamed into a bounded buffer: `{{ [0] * n }}` in text never
            // materialises more than the output limit.
            let mut sink = BoundedText::new();
            if let Err(e) = serde_json::to_writer(&mut sink, value) {
                let message = match sink.over {
                    Some(size) => format!(
                        "output of at least {size} bytes, above the limit `max_template_output_bytes` of {MAX_TEMPLATE_OUTPUT_BYTES} bytes"
                    ),
                    None => format!("not JSON: {e}"),
                };
                return Err(MjError::new(ErrorKind::BadSerialization, message));
            }
            String::from_utf8(sink.out)
                .map_err(|e| MjError::new(ErrorKind::BadSerialization, format!("not UTF-8: {e}")))?
        }
        _ => return Ok(None),
    }))
}
