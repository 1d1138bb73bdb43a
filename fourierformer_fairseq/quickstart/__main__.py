"""python -m fourierformer_fairseq.quickstart: see fourierformer_fairseq/quickstart/runner.py."""
import argparse
import sys

from .runner import FULL, SMALL, QuickstartConfig, QuickstartError, run_quickstart


def parse_args(argv=None) -> QuickstartConfig:
    defaults = QuickstartConfig()
    parser = argparse.ArgumentParser(
        prog="python -m fourierformer_fairseq.quickstart",
        description="Offline quickstart: trains a FourierFormer and its softmax twin on a synthetic "
                    "translation task with the stock fairseq-train, translates the test set with "
                    "fairseq-generate and prints both BLEU scores.",
    )
    parser.add_argument("--out-dir", default=defaults.out_dir,
                        help="where the corpus, data-bin, checkpoints, logs and translations go (default: %(default)s)")
    parser.add_argument("--max-epoch", type=int, default=None,
                        help=f"epochs per model (default: {FULL.max_epoch}; {SMALL.max_epoch} with --small)")
    parser.add_argument("--max-update", type=int, default=None,
                        help="stop each training after this many updates (default: no limit; reproducible, "
                             "unlike the time budget)")
    parser.add_argument("--time-budget-minutes", type=float, default=defaults.time_budget_minutes,
                        help="cap on each model's training time; training stops and keeps its best checkpoint "
                             "(default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=0, choices=(0, 1, 2),
                        help="models trained at the same time (0: 2 when there are 2+ cores; default: %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="corpus and training seed (default: %(default)s)")
    parser.add_argument("--beam", type=int, default=defaults.beam, help="beam size for fairseq-generate (default: %(default)s)")
    parser.add_argument("--small", action="store_true",
                        help="a tiny corpus and model for tests: checks the pipeline in about a minute, low BLEU")
    args = parser.parse_args(argv)
    return QuickstartConfig(out_dir=args.out_dir, small=args.small, max_epoch=args.max_epoch, max_update=args.max_update,
                            time_budget_minutes=args.time_budget_minutes, jobs=args.jobs, seed=args.seed,
                            beam=args.beam)


def main(argv=None) -> int:
    cfg = parse_args(argv)
    try:
        run_quickstart(cfg)
    except QuickstartError as e:
        print(f"quickstart failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("quickstart interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
