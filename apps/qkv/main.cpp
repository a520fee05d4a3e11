#include "cli.h"

int main(int argc, char** argv) { return qkv::cli::run(argc, argv); }
