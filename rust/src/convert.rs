//! Python values to and from the front door's Rust ones: an SPOE argument, and the decision core's
//! `RlsAnswer` as Envoy's `RateLimitResponse`.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyString};

use crate::proto::*;
use crate::spop;

const UINT32_MAX: u64 = u32::MAX as u64;

/// A SPOP value as `spop.read_frame`'s decoding gives it (`addresses`: ipaddress's two classes,
/// imported on first use).
pub fn spoe_value<'py>(
    py: Python<'py>,
    value: spop::Value,
    addresses: &mut Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut address = |raw: &[u8], v6: bool| -> PyResult<Bound<'py, PyAny>> {
        if addresses.is_none() {
            let module = py.import("ipaddress")?;
            *addresses = Some((
                module.getattr("IPv4Address")?,
                module.getattr("IPv6Address")?,
            ));
        }
        let (v4_class, v6_class) = addresses.as_ref().unwrap();
        (if v6 { v6_class } else { v4_class }).call1((PyBytes::new(py, raw),))
    };
    Ok(match value {
        spop::Value::Null => py.None().into_bound(py),
        spop::Value::Bool(flag) => PyBool::new(py, flag).to_owned().into_any(),
        spop::Value::Int(number) => number.into_pyobject(py)?.into_any(),
        spop::Value::UInt(number) => number.into_pyobject(py)?.into_any(),
        spop::Value::Ipv4(raw) => address(&raw, false)?,
        spop::Value::Ipv6(raw) => address(&raw, true)?,
        spop::Value::Bin(raw) => PyBytes::new(py, &raw).into_any(),
        spop::Value::Str(raw) => match std::str::from_utf8(&raw) {
            Ok(text) => PyString::new(py, text).into_any(),
            Err(_) => PyBytes::new(py, &raw)
                .call_method1(intern!(py, "decode"), ("utf-8", "surrogateescape"))?,
        },
    })
}

pub fn to_response(py: Python<'_>, answer: &Bound<'_, PyAny>) -> PyResult<RateLimitResponse> {
    let overall_ok: bool = answer.getattr(intern!(py, "overall_ok"))?.extract()?;
    let statuses_obj = answer.getattr(intern!(py, "statuses"))?;
    let mut statuses = Vec::new();
    for status in statuses_obj.try_iter()? {
        let status = status?;
        let code_obj = status.getattr(intern!(py, "code"))?;
        let code = if code_obj.extract::<&str>()? == "OK" {
            CODE_OK
        } else {
            CODE_OVER_LIMIT
        };
        let remaining: i128 = status.getattr(intern!(py, "limit_remaining"))?.extract()?;
        let limit_remaining = remaining.clamp(0, UINT32_MAX as i128) as u32;
        let current = status.getattr(intern!(py, "current_limit"))?;
        if current.is_none() {
            statuses.push(DescriptorStatus {
                code,
                current_limit: None,
                limit_remaining,
                duration_until_reset: None,
            });
            continue;
        }
        let unit_text = current.getattr(intern!(py, "unit"))?;
        let unit = unit_number(unit_text.extract::<&str>()?)
            .ok_or_else(|| PyValueError::new_err(format!("unknown unit {unit_text}")))?;
        let reset: f64 = status
            .getattr(intern!(py, "duration_until_reset"))?
            .extract()?;
        statuses.push(DescriptorStatus {
            code,
            current_limit: Some(RateLimit {
                name: current.getattr(intern!(py, "name"))?.extract()?,
                requests_per_unit: current
                    .getattr(intern!(py, "requests_per_unit"))?
                    .extract()?,
                unit,
            }),
            limit_remaining,
            duration_until_reset: Some(Duration {
                seconds: reset.ceil().max(0.0) as i64,
                nanos: 0,
            }),
        });
    }
    let mut headers = Vec::new();
    for pair in answer.getattr(intern!(py, "headers"))?.try_iter()? {
        let (key, value): (String, String) = pair?.extract()?;
        headers.push(HeaderValue { key, value });
    }
    Ok(RateLimitResponse {
        overall_code: if overall_ok { CODE_OK } else { CODE_OVER_LIMIT },
        statuses,
        response_headers_to_add: headers,
    })
}
