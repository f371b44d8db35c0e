//! The two base64 filters' codec: the `base64` crate, decoding standard or
//! URL-safe text with or without padding.

use ::base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use ::base64::engine::DecodePaddingMode;
use ::base64::{alphabet, Engine as _};

const LENIENT: GeneralPurposeConfig =
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT);
const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT);

/// Standard base64 with padding.
pub(super) fn encode(input: &[u8]) -> String {
    STANDARD.encode(input)
}

/// Decodes standard or URL-safe base64; padding optional, whitespace ignored.
pub(super) fn decode(input: &str) -> Option<Vec<u8>> {
    let clean: String = input.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let engine = if clean.contains(['-', '_']) {
        &URL_SAFE_LENIENT
    } else {
        &STANDARD_LENIENT
    };
    engine.decode(clean).ok()
}
