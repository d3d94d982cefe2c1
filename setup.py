"""Install the vla_policy_node ament_python package (colcon build or pip install)."""

from glob import glob
from pathlib import Path
import runpy

from setuptools import find_packages, setup

# The executables, as the ament registration of a source checkout writes them too. Read by
# path: colcon runs this file where the package itself is not importable.
REGISTRATION = runpy.run_path(
    str(Path(__file__).resolve().parent / 'vla_policy_node' / 'ament_registration.py'))
PACKAGE = REGISTRATION['PACKAGE']
EXECUTABLES = REGISTRATION['EXECUTABLES']

setup(
    name=PACKAGE,
    version='0.1.0',
    packages=find_packages(exclude=['test', 'test.*']),
    data_files=[
        ('share/doc/' + PACKAGE, ['LICENSE']),
        ('share/ament_index/resource_index/packages', [f'resource/{PACKAGE}']),
        (f'share/{PACKAGE}', ['package.xml']),
        (f'share/{PACKAGE}/launch', glob('launch/*.launch.py')),
        (f'share/{PACKAGE}/config', glob('config/*.yaml') + glob('config/*.xml')),
    ],
    install_requires=['setuptools'],
    zip_safe=True,
    maintainer='vla_policy_node maintainers',
    maintainer_email='vla-policy-node@example.com',
    description='Vision-Language-Action policies (SmolVLA, pi0) in a ROS 2 control loop.',
    license='Apache-2.0',
    python_requires='>=3.10',
    extras_require={'test': ['pytest']},     # colcon test runs pytest (tests_require is gone)
    entry_points={
        'console_scripts': [
            *(f'{name} = {entry}' for name, entry in EXECUTABLES.items()),
            'vla-policy-bench = vla_policy_node.bench.cli:main',
        ],
    },
)
