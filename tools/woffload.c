/* tools/woffload.c: the `woffload` command: `doctor` (what this machine offers
 * the shim), `demo` (the README's main job), `--help-env`. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "core/settings.h"
#include "tools/demo.h"
#include "tools/doctor.h"
#include "wo-config.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: woffload demo [--replay] [--trace TRACE] [--policy FILE]\n"
               "       woffload doctor [--env] [--policy FILE]\n"
               "       woffload --help-env\n"
               "       woffload --version\n"
               "\n"
               "demo        with a GPU and PyTorch: transformers under the shim, experts on host;\n"
               "            without: replay a trace recorded on an H100 through a policy\n"
               "            (--replay forces it) and show placement, PCIe bytes, tok/s\n"
               "doctor      report the CUDA driver, GPUs, toolkit, memlock and cgroup limits,\n"
               "            and whether the policy (WOFFLOAD_POLICY or --policy) parses\n"
               "doctor --env, --help-env\n"
               "            print every WOFFLOAD_* setting: default, current value, meaning\n"
               "\n"
               "Exit status: 0 success; 2 usage or input error (doctor: the policy does not\n"
               "load or a WOFFLOAD_* variable has a bad value, the rest still reported);\n"
               "1 failure (demo: the replay or the engine failed).\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"env", no_argument, NULL, 'e'},
        {"replay", no_argument, NULL, 'r'},
        {"trace", required_argument, NULL, 't'},
        {"policy", required_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *policy = NULL, *trace = NULL;
    bool env = false, replay = false, demo;
    int c;

    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("woffload %s\n", WO_VERSION);
        return 0;
    }
    if (strcmp(argv[1], "--help-env") == 0)
        return wo_doctor(stdout, NULL, true);
    demo = strcmp(argv[1], "demo") == 0;
    if (!demo && strcmp(argv[1], "doctor") != 0) {
        fprintf(stderr, "woffload: unknown command \"%s\"\n", argv[1]);
        usage(stderr);
        return 2;
    }
    optind = 2;
    while ((c = getopt_long(argc, argv, "ep:rt:h", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            replay = true;
            break;
        case 't':
            trace = optarg;
            break;
        case 'e':
            env = true;
            break;
        case 'p':
            policy = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (demo)
        return wo_demo(stdout, trace, policy, replay);
    return wo_doctor(stdout, policy, env);
}
