//! The `dpctl` binary: everything is in the library (`dpctl::main`).

fn main() {
    dpctl::main()
}
