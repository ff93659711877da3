from asyncrl.version import TrainerVersion  # noqa
