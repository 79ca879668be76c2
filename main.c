/* kvchat: a terminal chat for local language models.  See README.md. */
#include "cli/cli.h"

int main(int argc, char **argv) { return cli_main(argc, argv); }
