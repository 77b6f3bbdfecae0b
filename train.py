"""``python train.py [experiment=NAME] [group=option] [key=value]``; same as the ``lit-train`` command."""

from lit_transformers.train import main

if __name__ == "__main__":
    main()
