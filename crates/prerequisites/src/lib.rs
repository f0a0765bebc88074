//! Nothing to call: this crate's build script checks, before libjpeg-turbo's own build starts,
//! that `cmake` and `nasm` are installed, and otherwise stops the build with one line that says
//! what to install. `turbojpeg-region` depends on it for that alone.
