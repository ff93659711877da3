"""One training run, from a config to a finished run directory.

``assemble`` holds the two entry points (``asyncrl.train`` and
``asyncrl.build_controller``); ``train`` runs the controller and writes the run
directory; ``preflight`` checks a config before anything starts; ``options``
makes the views of it the components are built from; ``backends`` builds the
engines and the trainer; ``resume`` prepares ``--resume``; ``rundir``, ``lock``,
``signals`` and ``export`` look after the run directory, its lock,
SIGINT/SIGTERM and the final policy.
"""
