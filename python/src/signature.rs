//! What `help(gpufeed.Pipeline)` and editors show: the constructor's signature (every keyword
//! with its type and default) and a docstring saying what each does, both made from the one
//! keyword table, [`crate::options::KEYWORDS`], when the module is imported.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::options::{Defaults, KEYWORDS};
use crate::pipeline::Pipeline;

/// Width of the docstring's text.
const DOC_WIDTH: usize = 92;

/// Gives `gpufeed.Pipeline` its `__signature__` (what `inspect.signature` and `help()` show)
/// and a docstring that lists every keyword: `name: type = default` and what it does.
pub(crate) fn describe_pipeline(py: Python<'_>) -> PyResult<()> {
    let defaults = Defaults::new();
    let inspect = py.import("inspect")?;
    let parameter = inspect.getattr("Parameter")?;
    let literal_eval = py.import("ast")?.getattr("literal_eval")?;
    let namespace = annotation_namespace(py)?;
    let eval = py.import("builtins")?.getattr("eval")?;
    let parameters = PyList::empty(py);
    let mut doc = String::new();
    for keyword in KEYWORDS {
        let default = (keyword.default)(&defaults);
        // `source` may be given by position, as `Pipeline("val/")`; the others by name only.
        let kind = if keyword.name == "source" {
            "POSITIONAL_OR_KEYWORD"
        } else {
            "KEYWORD_ONLY"
        };
        // The annotation as an object, so that it prints as written (a string would print
        // quoted); the text itself should it not evaluate.
        let annotation = eval
            .call1((keyword.python_type, &namespace))
            .unwrap_or_else(|_| PyString::new(py, keyword.python_type).into_any());
        let arguments = PyDict::new(py);
        arguments.set_item("default", literal_eval.call1((default.as_str(),))?)?;
        arguments.set_item("annotation", annotation)?;
        parameters
            .append(parameter.call((keyword.name, parameter.getattr(kind)?), Some(&arguments))?)?;
        doc.push_str(&format!(
            "\n{}: {} = {}\n{}\n",
            keyword.name,
            keyword.python_type,
            default,
            wrap(keyword.doc, "    ", DOC_WIDTH)
        ));
    }
    let signature = inspect
        .getattr("Signature")?
        .call1((PyTuple::new(py, parameters)?,))?;
    let class = py.get_type::<Pipeline>();
    let summary: String = class
        .getattr("__doc__")?
        .extract::<Option<String>>()?
        .unwrap_or_default();
    class.setattr("__signature__", signature)?;
    class.setattr(
        "__doc__",
        format!(
            "{}\n\nKeywords (gpufeed.KEYWORDS names them; passing a default is the same as \
             leaving it out):\n{doc}",
            summary.trim_end()
        ),
    )?;
    Ok(())
}

/// The names the keywords' types use: `typing`'s and `os`.
fn annotation_namespace(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let namespace = PyDict::new(py);
    let typing = py.import("typing")?;
    for name in ["Any", "Literal", "Optional", "Sequence", "Tuple", "Union"] {
        namespace.set_item(name, typing.getattr(name)?)?;
    }
    namespace.set_item("os", py.import("os")?)?;
    Ok(namespace)
}

/// `text` in lines of at most `width` characters (longer words stand alone), each starting
/// with `indent`.
fn wrap(text: &str, indent: &str, width: usize) -> String {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::from(indent);
    for word in text.split_whitespace() {
        if line.len() > indent.len() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::replace(&mut line, String::from(indent)));
        }
        if line.len() > indent.len() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines.join("\n")
}
