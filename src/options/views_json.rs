//! A recipe of views of its own, written as JSON: what `gpufeed run --views FILE.json` and
//! Python's `views=[{...}, ...]` read, and what [`Views::to_json`] writes.
//!
//! The spec is a list of groups (or an object whose `groups` is that list); each group is an
//! object of [`ViewGroup`]'s fields, every one but `size` optional:
//!
//! ```json
//! [{"size": 224, "count": 2, "scale": [0.08, 1.0], "ratio": [0.75, 1.3333333333333333],
//!   "interpolation": "bicubic", "flip": 0.5,
//!   "color_jitter": {"p": 0.8, "brightness": 0.4, "contrast": 0.4, "saturation": 0.2, "hue": 0.1},
//!   "grayscale": 0.2, "blur": {"p": 0.5, "kernel_size": 9, "sigma": [0.1, 2.0]},
//!   "solarize": 0.2}]
//! ```
//!
//! Left out, a field is torchvision's default or off: `count` 1, `scale` 0.08 to 1, `ratio` 3/4
//! to 4/3, `interpolation` bilinear, no flip, jitter, grayscale, blur or solarize; in
//! `color_jitter` a missing factor is 0 (not jittered) and `p` 1; in `blur`, `p` 1 and `sigma`
//! 0.1 to 2. A key that is none of these is refused, naming it, so that a misspelt operation
//! is not silently left out.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::{ColorJitter, DrawRange, Interpolation, ViewBlur, ViewGroup, ViewOps, Views};
use super::{ViewsPreset, RANDOM_CROP_RATIO, RANDOM_CROP_SCALE};
use crate::error::{Error, Result};

/// The keys of a group, of its `color_jitter` and of its `blur`.
const GROUP_KEYS: &str = "size, count, scale, ratio, interpolation, flip, color_jitter, \
                          grayscale, blur, solarize";
const JITTER_KEYS: &str = "p, brightness, contrast, saturation, hue";
const BLUR_KEYS: &str = "p, kernel_size, sigma";

/// torchvision's `GaussianBlur` sigma by default.
const BLUR_SIGMA: DrawRange = DrawRange::new(0.1, 2.0);

impl Views {
    /// A preset's name (`dinov2`, `simclr`) or a JSON spec of groups (see the module's
    /// documentation), seed 0.
    pub fn parse(spec: &str) -> Result<Views> {
        let text = spec.trim();
        if text.starts_with('[') || text.starts_with('{') {
            return Views::from_json(text);
        }
        text.parse::<ViewsPreset>()
            .map(Views::preset)
            .map_err(|e| Error::invalid("views", format!("{e}, or a JSON list of view groups")))
    }

    /// What `gpufeed run --views` and Python's `views=` take: a preset's name, a JSON spec's
    /// text, or the path of a file holding a spec ([`Views::load_file`]), seed 0. Text that is
    /// neither a preset nor JSON is read as a path when it names a file, ends in `.json` or
    /// holds a `/`; otherwise the error lists the presets.
    pub fn load(spec: &str) -> Result<Views> {
        let text = spec.trim();
        let inline = text.starts_with('[') || text.starts_with('{');
        if inline || text.parse::<ViewsPreset>().is_ok() {
            return Views::parse(text);
        }
        let path = Path::new(text);
        if path.is_file() || text.ends_with(".json") || text.contains('/') {
            return Views::load_file(path);
        }
        Views::parse(text)
    }

    /// The views of the JSON spec in the file at `path` ([`Views::from_json`]); errors name the
    /// file.
    pub fn load_file(path: impl AsRef<Path>) -> Result<Views> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path)
            .map_err(|e| Error::invalid("views", format!("cannot read {}: {e}", path.display())))?;
        Views::from_json(&json).map_err(|e| match e {
            Error::InvalidOption { option, reason } => Error::InvalidOption {
                option,
                reason: format!("{}: {reason}", path.display()),
            },
            other => other,
        })
    }

    /// The views a JSON spec describes (a list of groups, or `{"groups": [...]}`), seed 0,
    /// checked as [`Views::validate`] checks them.
    pub fn from_json(text: &str) -> Result<Views> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::invalid("views", format!("not a JSON spec of views: {e}")))?;
        let groups = match &value {
            Value::Array(groups) => groups,
            Value::Object(object) => {
                if let Some(key) = object.keys().find(|k| k.as_str() != "groups") {
                    return Err(Error::invalid(
                        "views",
                        format!("unknown key {key:?} (expected groups)"),
                    ));
                }
                match object.get("groups") {
                    Some(Value::Array(groups)) => groups,
                    _ => return Err(Error::invalid("views", "\"groups\": not a list of groups")),
                }
            }
            _ => return Err(Error::invalid("views", "a spec is a list of view groups")),
        };
        let groups = groups
            .iter()
            .enumerate()
            .map(|(at, g)| group_from_json(g, at))
            .collect::<Result<Vec<_>>>()?;
        let views = Views::new(groups);
        views.validate()?;
        Ok(views)
    }

    /// The groups as a JSON spec (every field written) that [`Views::from_json`] reads back
    /// as the same groups; the seed and Pillow version are not part of it.
    pub fn to_json(&self) -> String {
        Value::Array(self.groups.iter().map(group_to_json).collect()).to_string()
    }
}

/// One group's JSON object.
fn group_to_json(g: &ViewGroup) -> Value {
    let range = |r: DrawRange| json!([r.min, r.max]);
    let o = &g.ops;
    let mut group = json!({
        "size": g.size,
        "count": g.count,
        "scale": range(g.scale),
        "ratio": range(g.ratio),
        "interpolation": g.interpolation.name(),
        "flip": o.flip,
        "color_jitter": {
            "p": o.jitter_p,
            "brightness": o.jitter.brightness,
            "contrast": o.jitter.contrast,
            "saturation": o.jitter.saturation,
            "hue": o.jitter.hue,
        },
        "grayscale": o.grayscale,
        "solarize": o.solarize,
    });
    if let Some(b) = &o.blur {
        group["blur"] = json!({"p": b.p, "kernel_size": b.kernel_size, "sigma": range(b.sigma)});
    }
    group
}

/// Reads the fields of one JSON object, naming the place (`group 0`, `group 0: blur`) in its
/// errors.
struct Fields<'a> {
    object: &'a Map<String, Value>,
    place: String,
}

impl<'a> Fields<'a> {
    fn new(value: &'a Value, place: String, keys: &str) -> Result<Fields<'a>> {
        let Value::Object(object) = value else {
            return Err(Error::invalid(
                "views",
                format!("{place}: not a JSON object"),
            ));
        };
        let known: Vec<&str> = keys.split(", ").collect();
        if let Some(key) = object.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(Error::invalid(
                "views",
                format!("{place}: unknown key {key:?} (expected {keys})"),
            ));
        }
        Ok(Fields { object, place })
    }

    fn wrong(&self, key: &str, what: &str) -> Error {
        Error::invalid("views", format!("{}: {key}: {what}", self.place))
    }

    fn number(&self, key: &str, default: f64) -> Result<f64> {
        match self.object.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.wrong(key, "not a number")),
        }
    }

    fn whole(&self, key: &str, default: Option<u32>) -> Result<u32> {
        match (self.object.get(key), default) {
            (None, Some(d)) => Ok(d),
            (None, None) => Err(self.wrong(key, "missing")),
            (Some(v), _) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.wrong(key, "not a whole number from 0 to 4294967295")),
        }
    }

    fn range(&self, key: &str, default: DrawRange) -> Result<DrawRange> {
        match self.object.get(key) {
            None => Ok(default),
            Some(Value::Array(pair)) => match pair.as_slice() {
                [min, max] => match (min.as_f64(), max.as_f64()) {
                    (Some(min), Some(max)) => Ok(DrawRange::new(min, max)),
                    _ => Err(self.wrong(key, "not two numbers [min, max]")),
                },
                _ => Err(self.wrong(key, "not two numbers [min, max]")),
            },
            Some(_) => Err(self.wrong(key, "not two numbers [min, max]")),
        }
    }

    fn object(&self, key: &str) -> Option<&'a Value> {
        self.object.get(key)
    }
}

/// Group `at` of a spec.
fn group_from_json(value: &Value, at: usize) -> Result<ViewGroup> {
    let f = Fields::new(value, format!("group {at}"), GROUP_KEYS)?;
    let interpolation = match f.object("interpolation") {
        None => Interpolation::Bilinear,
        Some(Value::String(name)) => name
            .parse::<Interpolation>()
            .map_err(|e| f.wrong("interpolation", &e.to_string()))?,
        Some(_) => return Err(f.wrong("interpolation", "not a filter's name")),
    };
    let (jitter, jitter_p) = match f.object("color_jitter") {
        None => (ViewOps::none().jitter, 0.0),
        Some(v) => {
            let j = Fields::new(v, format!("group {at}: color_jitter"), JITTER_KEYS)?;
            let jitter = ColorJitter {
                brightness: j.number("brightness", 0.0)?,
                contrast: j.number("contrast", 0.0)?,
                saturation: j.number("saturation", 0.0)?,
                hue: j.number("hue", 0.0)?,
            };
            (jitter, j.number("p", 1.0)?)
        }
    };
    let blur = match f.object("blur") {
        None => None,
        Some(v) => {
            let b = Fields::new(v, format!("group {at}: blur"), BLUR_KEYS)?;
            Some(ViewBlur {
                p: b.number("p", 1.0)?,
                kernel_size: b.whole("kernel_size", None)?,
                sigma: b.range("sigma", BLUR_SIGMA)?,
            })
        }
    };
    Ok(ViewGroup {
        size: f.whole("size", None)?,
        count: f.whole("count", Some(1))?,
        scale: f.range("scale", RANDOM_CROP_SCALE)?,
        ratio: f.range("ratio", RANDOM_CROP_RATIO)?,
        interpolation,
        ops: ViewOps {
            flip: f.number("flip", 0.0)?,
            jitter,
            jitter_p,
            grayscale: f.number("grayscale", 0.0)?,
            blur,
            solarize: f.number("solarize", 0.0)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_read_back_from_their_json() {
        for views in [Views::dinov2(), Views::simclr()] {
            let text = views.to_json();
            assert_eq!(
                Views::from_json(&text).expect("its own spec"),
                views,
                "{text}"
            );
            assert_eq!(Views::parse(&text).expect("parsed"), views);
            let wrapped = format!("{{\"groups\": {text}}}");
            assert_eq!(Views::from_json(&wrapped).expect("wrapped"), views);
        }
        assert_eq!(Views::parse(" DINOv2 ").expect("a preset"), Views::dinov2());
    }

    #[test]
    fn a_spec_loads_from_a_preset_json_text_or_a_file() {
        let dir = std::env::temp_dir().join(format!("gpufeed-views-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("folder");
        let file = dir.join("recipe.json");
        std::fs::write(&file, r#"[{"size": 64, "count": 3}]"#).expect("write");
        let path = file.to_str().expect("utf-8 path");
        let inline = Views::load(r#" [{"size": 64, "count": 3}] "#).expect("inline");
        assert_eq!(Views::load(path).expect("file").groups, inline.groups);
        assert_eq!(Views::load_file(&file).expect("file").groups, inline.groups);
        assert_eq!(
            Views::load("dinov2").expect("preset").groups,
            Views::dinov2().groups
        );

        let message = |spec: &str| Views::load(spec).map(|_| ()).unwrap_err().to_string();
        let missing = dir.join("missing.json");
        let said = message(missing.to_str().expect("utf-8 path"));
        assert!(
            said.contains("cannot read") && said.contains("missing.json"),
            "{said}"
        );
        std::fs::write(&file, r#"[{"size": 64, "colour": 1}]"#).expect("write");
        let said = message(path);
        assert!(
            said.contains("recipe.json") && said.contains("\"colour\""),
            "{said}"
        );
        let said = message("dino");
        assert!(said.contains("dinov2") && said.contains("simclr"), "{said}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn left_out_fields_are_torchvisions_defaults() {
        let views = Views::from_json(r#"[{"size": 96}]"#).expect("spec");
        assert_eq!(views.groups, vec![ViewGroup::new(96, 1)]);
        let views = Views::from_json(
            r#"[{"size": 128, "count": 4, "color_jitter": {"brightness": 0.5},
                 "blur": {"kernel_size": 5}}]"#,
        )
        .expect("spec");
        let ops = views.groups[0].ops;
        assert_eq!(views.count(), 4);
        assert_eq!(
            (ops.jitter_p, ops.jitter.brightness, ops.jitter.hue),
            (1.0, 0.5, 0.0)
        );
        assert_eq!(
            ops.blur,
            Some(ViewBlur {
                p: 1.0,
                kernel_size: 5,
                sigma: BLUR_SIGMA
            })
        );
        assert_eq!((ops.flip, ops.grayscale, ops.solarize), (0.0, 0.0, 0.0));
    }

    #[test]
    fn mistakes_are_refused_naming_the_group_and_key() {
        let refused = |text: &str, says: &str| {
            let e = Views::from_json(text).expect_err(text).to_string();
            assert!(e.contains(says), "{text}: {e}");
        };
        refused(
            r#"[{"size": 96, "colour_jitter": {}}]"#,
            "group 0: unknown key \"colour_jitter\"",
        );
        refused(r#"[{"size": 96}, {"count": 2}]"#, "group 1: size: missing");
        refused(r#"[{"size": -3}]"#, "size: not a whole number");
        refused(r#"[{"size": 96, "scale": 0.5}]"#, "scale: not two numbers");
        refused(
            r#"[{"size": 96, "interpolation": "cubic"}]"#,
            "unknown interpolation",
        );
        refused(r#"[{"size": 96, "blur": {"kernel_size": 4}}]"#, "odd");
        refused(
            r#"[{"size": 96, "blur": {"kernel": 5}}]"#,
            "group 0: blur: unknown key",
        );
        refused(r#"[{"size": 96, "flip": 2}]"#, "not a chance");
        refused(r#"[]"#, "no view group");
        refused(r#"{"group": []}"#, "unknown key \"group\"");
        refused("[{\"size\": 96", "not a JSON spec");
        let e = Views::parse("dino")
            .expect_err("no such preset")
            .to_string();
        assert!(e.contains("dinov2") && e.contains("JSON"), "{e}");
    }
}
