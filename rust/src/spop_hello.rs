//! The HAPROXY-HELLO's negotiation, as `spoe.hello` checks it: the SPOP version, the frame size
//! agreed, a health check; with the messages of the Python agent's DISCONNECT statuses.

use crate::spop::{error, kv_list, lossy, SpopError, Value, MIN_FRAME_SIZE};

/// Python's `repr` of a string (the message of status 8 quotes what HAProxy offered).
pub fn py_repr(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `str(value or "")` for a HELLO's `supported-versions` (only text can name a version).
pub fn version_text(value: Option<&Value>) -> String {
    match value {
        Some(Value::Str(raw)) => lossy(raw),
        Some(Value::Int(v)) if *v != 0 => v.to_string(),
        Some(Value::UInt(v)) if *v != 0 => v.to_string(),
        Some(Value::Bool(true)) => "True".to_string(),
        Some(Value::Ipv4(raw)) => std::net::Ipv4Addr::from(*raw).to_string(),
        Some(Value::Ipv6(raw)) => std::net::Ipv6Addr::from(*raw).to_string(),
        Some(Value::Bin(raw)) if !raw.is_empty() => format!("b{}", py_repr(&lossy(raw))),
        _ => String::new(),
    }
}

/// `spoe.hello`'s checks of a HAPROXY-HELLO payload: the agreed frame size and whether it is a
/// health check.
pub fn negotiate(payload: &[u8], max_frame_size: u64) -> Result<(u64, bool), SpopError> {
    let offer = kv_list(payload)?;
    let get = |name: &str| {
        offer
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, v)| v)
    };
    let versions = version_text(get("supported-versions"));
    if !versions
        .split(',')
        .any(|version| version.trim().starts_with("2."))
    {
        return Err(error(
            8,
            format!(
                "unsupported SPOP versions {}: this agent speaks 2.0",
                py_repr(&versions)
            ),
        ));
    }
    let theirs: i128 = match get("max-frame-size") {
        Some(Value::Int(v)) => *v as i128,
        Some(Value::UInt(v)) => *v as i128,
        _ => return Err(error(6, "max-frame-size value not found")),
    };
    if theirs < MIN_FRAME_SIZE as i128 {
        return Err(error(
            9,
            format!("max-frame-size {theirs} is smaller than {MIN_FRAME_SIZE}"),
        ));
    }
    let limit = (theirs as u128).min(max_frame_size as u128) as u64;
    Ok((limit, matches!(get("healthcheck"), Some(Value::Bool(true)))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repr_as_python() {
        assert_eq!(py_repr("1.0"), "'1.0'");
        assert_eq!(py_repr("it's"), "\"it's\"");
    }
}
