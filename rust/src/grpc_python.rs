//! The gRPC door's side of the boundary (`batch.rs`): a queued `RateLimitRequest` as Python takes
//! it, and Python's answer, the decision core's `RlsAnswer` (or a gRPC error), as Envoy's
//! `RateLimitResponse`.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use tonic::{Code, Status};

use crate::grpc_service::Answer;
use crate::proto::*;

const UINT32_MAX: u64 = u32::MAX as u64;

/// A request as Python takes it: `(id, domain, descriptors, hits_addend, seconds left)`, each
/// descriptor `class(entries, limit, hits_addend)` (ratewarden's `RequestDescriptor`).
pub fn request<'py>(
    class: &Bound<'py, PyAny>,
    id: u64,
    request: RateLimitRequest,
    left: f64,
) -> PyResult<Bound<'py, PyTuple>> {
    let py = class.py();
    let descriptors = PyList::empty(py);
    for descriptor in &request.descriptors {
        let entries = PyTuple::new(
            py,
            descriptor
                .entries
                .iter()
                .map(|e| PyTuple::new(py, [e.key.as_str(), e.value.as_str()]).unwrap()),
        )?;
        let limit = match &descriptor.limit {
            Some(l) => (l.requests_per_unit, unit_name(l.unit).unwrap_or(""))
                .into_pyobject(py)?
                .into_any(),
            None => py.None().into_bound(py),
        };
        let hits = match &descriptor.hits_addend {
            Some(h) => h.value.into_pyobject(py)?.into_any(),
            None => py.None().into_bound(py),
        };
        descriptors.append(class.call1((entries, limit, hits))?)?;
    }
    (id, request.domain, descriptors, request.hits_addend, left).into_pyobject(py)
}

/// An answer as Python gives it: `(id, answer)`, `answer` an `RlsAnswer`, or `(code, message)` for a
/// gRPC error (3 INVALID_ARGUMENT, 14 UNAVAILABLE, 13 INTERNAL...).
pub fn answer(item: &Bound<'_, PyAny>) -> PyResult<(u64, Answer)> {
    let (id, answer): (u64, Bound<'_, PyAny>) = item.extract()?;
    let converted = if answer.is_instance_of::<PyTuple>() {
        match answer.extract::<(i32, String)>() {
            Ok((code, message)) => Err(Status::new(Code::from_i32(code), message)),
            Err(error) => Err(Status::internal(format!("bad error answer: {error}"))),
        }
    } else {
        to_response(item.py(), &answer)
            .map_err(|error| Status::internal(format!("bad answer: {error}")))
    };
    Ok((id, converted))
}

fn to_response(py: Python<'_>, answer: &Bound<'_, PyAny>) -> PyResult<RateLimitResponse> {
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
