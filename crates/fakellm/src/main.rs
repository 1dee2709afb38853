fn main() {
    std::process::exit(fakellm::main_with_args(std::env::args().skip(1).collect()));
}
