# A floating base tag and a package installed outside scripts/setup.sh.
FROM debian:bookworm-slim
COPY scripts/setup.sh /opt/pdserve/scripts/setup.sh
RUN bash -c 'source /opt/pdserve/scripts/setup.sh && pd_install_packages'
RUN apt-get update && apt-get install -y vim
