//! The SPOE agent's side of the boundary (`batch.rs`): a queued NOTIFY's message as Python takes it
//! (its arguments as `spop.read_frame` decodes them), and Python's answer, its SET-VAR actions.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyString, PyTuple};

use crate::spoe::SpoeRequest;
use crate::spop;

/// ipaddress's two classes, imported on first use in a batch.
pub type Addresses<'py> = Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>;

/// A message as Python takes it: `(id, args, peer host, peer port)`, `args` a dict of its arguments,
/// or None when the NOTIFY frame has no message of the agent's name.
pub fn request<'py>(
    py: Python<'py>,
    addresses: &mut Addresses<'py>,
    id: u64,
    request: SpoeRequest,
) -> PyResult<Bound<'py, PyTuple>> {
    let args = match request.args {
        None => py.None().into_bound(py),
        Some(args) => {
            let dict = PyDict::new(py);
            for (name, value) in args {
                let value = spoe_value(py, value, addresses)?;
                dict.set_item(name, value)?;
            }
            dict.into_any()
        }
    };
    (id, args, request.peer.ip().to_string(), request.peer.port()).into_pyobject(py)
}

/// An answer as Python gives it: `(id, actions)`, a list of encoded SET-VAR actions (`spop.set_var`).
pub fn answer(item: &Bound<'_, PyAny>) -> PyResult<(u64, Vec<Vec<u8>>)> {
    let (id, actions): (u64, Vec<Bound<'_, PyBytes>>) = item.extract()?;
    Ok((id, actions.iter().map(|a| a.as_bytes().to_vec()).collect()))
}

/// A SPOP value as `spop.read_frame`'s decoding gives it (`addresses`: ipaddress's two classes,
/// imported on first use).
fn spoe_value<'py>(
    py: Python<'py>,
    value: spop::Value,
    addresses: &mut Addresses<'py>,
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
