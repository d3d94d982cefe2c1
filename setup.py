# SPDX-License-Identifier: Apache-2.0
"""Install the vla_policy_node ament_python package (colcon build or pip install)."""

from glob import glob
from pathlib import Path
import runpy
import shutil

from setuptools import find_packages, setup
from setuptools.command.develop import develop
from setuptools.command.install_scripts import install_scripts

# The executables, as the ament registration of a source checkout writes them too. Read by
# path: colcon runs this file where the package itself is not importable.
REGISTRATION = runpy.run_path(
    str(Path(__file__).resolve().parent / 'vla_policy_node' / 'ament_registration.py'))
PACKAGE = REGISTRATION['PACKAGE']
EXECUTABLES = REGISTRATION['EXECUTABLES']
# The user's commands: in lib/vla_policy_node with every script (setup.cfg), and copied to bin/.
COMMANDS = REGISTRATION['COMMANDS']


def copy_commands_to_bin(script_dir: str) -> list[str]:
    """Copy the user's commands from ``<prefix>/lib/vla_policy_node`` to ``<prefix>/bin``; return the copies."""
    lib = Path(script_dir)
    if lib.parts[-2:] != ('lib', PACKAGE):      # a wheel or a plain venv: the scripts are in bin already
        return []
    (lib.parent.parent / 'bin').mkdir(parents=True, exist_ok=True)
    return [str(shutil.copy2(lib / name, lib.parent.parent / 'bin' / name)) for name in COMMANDS]


class InstallScripts(install_scripts):
    """colcon build: the user's commands in ``bin`` too, which the workspace's setup puts on PATH."""

    def run(self) -> None:
        """Install the scripts, then copy the user's commands to bin (listed in the install record)."""
        super().run()
        self.outfiles += copy_commands_to_bin(self.install_dir)


class Develop(develop):
    """colcon build --symlink-install: the user's commands in ``bin`` too."""

    def run(self) -> None:
        """Install in development mode, then copy the user's commands to bin."""
        super().run()
        copy_commands_to_bin(self.script_dir)


setup(
    name=PACKAGE,
    version='0.1.0',
    packages=find_packages(exclude=['test', 'test.*']),
    # The trained policies and the SO-101's model ship inside the Python package, so an editable
    # install (the source tree) and a colcon install (site-packages) find them at the same place
    # relative to their module: see vla_policy_node/sim/__init__.py.
    package_data={
        f'{PACKAGE}.sim.planar': ['touch_policy/*.json', 'touch_policy/*.safetensors',
                                  'touch_policy/*.png', 'touch_policy/vlm/*.json'],
        f'{PACKAGE}.sim.so101': ['touch_policy/*.json', 'touch_policy/*.safetensors', 'touch_policy/*.png',
                                 'touch_policy/vlm/*.json', 'assets/*.xml', 'assets/*.md', 'assets/LICENSE',
                                 'assets/meshes/*.stl', 'assets/meshes/visual/*.stl'],
    },
    data_files=[
        ('share/doc/' + PACKAGE, ['LICENSE']),
        ('share/ament_index/resource_index/packages', [f'resource/{PACKAGE}']),
        (f'share/{PACKAGE}', ['package.xml']),
        (f'share/{PACKAGE}/launch', glob('launch/*.launch.py')),
        (f'share/{PACKAGE}/config', glob('config/*.yaml') + glob('config/*.xml')),
    ],
    install_requires=['setuptools'],
    zip_safe=False,
    maintainer='vla_policy_node maintainers',
    maintainer_email='vla-policy-node@example.com',
    description='Vision-Language-Action policies (SmolVLA, pi0, pi0.5) in a ROS 2 control loop.',
    license='Apache-2.0',
    python_requires='>=3.10',
    extras_require={'test': ['pytest']},     # colcon test runs pytest (tests_require is gone)
    entry_points={
        'console_scripts': [
            *(f'{name} = {entry}' for name, entry in {**EXECUTABLES, **COMMANDS}.items()),
        ],
    },
    cmdclass={'install_scripts': InstallScripts, 'develop': Develop},
)
